"""`python -m dflashx.tiny.reship [VARIANT]`: the maintainers' step that ships a fresh tiny build inside the
package (a build from the code, then `shipped.ship`). Its own module: `shipped` is what `build` imports, so
the build is imported here, above both, and the two import no cycle."""

from __future__ import annotations

import argparse

from dflashx.tiny.build import ensure_tiny_target
from dflashx.tiny.shipped import ship


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Ship a fresh tiny build inside the package.")
    parser.add_argument("variant", nargs="?", default="tiny-qwen3")
    args = parser.parse_args(argv)
    print(ship(args.variant, ensure_tiny_target(args.variant, log=print, shipped=False)))


if __name__ == "__main__":
    main()
