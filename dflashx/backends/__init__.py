"""Generation backends behind one interface (`base.Backend`): `sglang` (OpenAI-compatible HTTP to
servers it launches or attaches to, `servers.py`) and `transformers_local` (in-process generate).
Import the concrete modules lazily: `transformers_local` pulls in torch, `sglang` only httpx."""
