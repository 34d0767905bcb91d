"""Recipe schema: a hardware profile (`hardware`, or `dflashx/hardware_profiles/NAME.yaml`, or `local`: this
machine, detected by the CLI): facts about the node, never settings. A GPU named in the datasheet table
(`dflashx.config.gpus`) takes the figures the profile leaves out from there."""

# No `from __future__ import annotations` here: pydantic would evaluate every field's string
# annotation when the class is created, which `dflashx plan`'s start-up pays (benchmarks/cli_latency.py).

from typing import Any

from pydantic import Field, model_validator

from dflashx.config.fields import UNCALIBRATED, FiniteFloat, Strict, calibrates, key_problem
from dflashx.config.gpus import GPUS, STAND_IN, gpu_model

# A fact of the node: a pilot's serving and training figures were measured on it (dflashx.plan.calibration).
NODE_FACT = calibrates("serving", "training")


class GpuSpec(Strict):
    name: str = Field(description="GPU model, e.g. `H200`; a model of the GPU table (dflashx/config/gpus.py: "
                      f"{', '.join(g.name for g in GPUS)}) fills in the figures left out.")
    memory_gb: FiniteFloat = Field(gt=0, description="Per-GPU memory, GB (1e9 bytes), as the driver reports it.")
    bandwidth_tbs: FiniteFloat | None = Field(gt=0, description="Per-GPU memory bandwidth, TB/s; null = unknown "
                                              "(the plan prices the table's slowest and says so).")
    bf16_tflops: FiniteFloat | None = Field(gt=0, description="Dense BF16 TFLOP/s (not the sparse headline); null "
                                            "= unknown (the plan prices the table's slowest and says so).")
    fp8_tflops: FiniteFloat | None = Field(None, gt=0, description="Dense FP8 TFLOP/s; null = no FP8.")

    @model_validator(mode="before")
    @classmethod
    def _from_table(cls, data: Any) -> Any:
        """A table model's figures for the keys the profile leaves out (a key written, null too, stays)."""
        model = gpu_model(data["name"]) if isinstance(data, dict) and isinstance(data.get("name"), str) else None
        if model is None:
            return data
        table = {"memory_gb": model.memory_gb, "bandwidth_tbs": model.bandwidth_tbs,
                 "bf16_tflops": model.bf16_tflops, "fp8_tflops": model.fp8_tflops}
        return {k: v for k, v in table.items() if v is not None} | data

    @property
    def priced_bandwidth_tbs(self) -> float:
        """The bandwidth the planner prices with: the GPU's, else (unknown) the table's slowest."""
        return self.bandwidth_tbs if self.bandwidth_tbs is not None else STAND_IN.bandwidth_tbs

    @property
    def priced_bf16_tflops(self) -> float:
        """The dense BF16 peak the planner prices with: the GPU's, else (unknown) the table's slowest."""
        return self.bf16_tflops if self.bf16_tflops is not None else STAND_IN.bf16_tflops


class HardwareProfile(Strict):
    name: str = Field(description="Profile name; a profile file's name is its file name without .yaml.",
                      json_schema_extra=NODE_FACT)
    description: str = Field("", description="Free text about the node.", json_schema_extra=UNCALIBRATED)
    gpu: GpuSpec | None = Field(None, description="null for the CPU profile.",
                                json_schema_extra=NODE_FACT)
    gpus_per_node: int = Field(0, ge=0, description="GPUs per node (0 for the CPU profile).",
                               json_schema_extra=NODE_FACT)
    nodes: int = Field(1, ge=1, description="Nodes used together.", json_schema_extra=NODE_FACT)
    interconnect: str = Field("none", description="GPU interconnect, e.g. `NVLink 5` or `PCIe 5`.",
                              json_schema_extra=NODE_FACT)
    interconnect_gbs: FiniteFloat | None = Field(
        None, gt=0, description="GPU-to-GPU bandwidth inside a node, per GPU and direction, GB/s; null = one GPU.",
        json_schema_extra=NODE_FACT
    )
    internode_gbs: FiniteFloat | None = Field(
        None, gt=0, description="Network bandwidth between nodes, per GPU and direction, GB/s; null = one node.",
        json_schema_extra=NODE_FACT
    )
    host_memory_gb: FiniteFloat | None = Field(None, gt=0,
                                               description="Host (CPU) memory per node, GB; null = unknown.",
                                               json_schema_extra=NODE_FACT)
    usd_per_gpu_hour: FiniteFloat = Field(0.0, ge=0, description="Rental price per GPU-hour, for cost estimates.",
                                          json_schema_extra=UNCALIBRATED)
    usd_source: str = Field("", description="Where the price comes from (provider, list or quote).",
                            json_schema_extra=UNCALIBRATED)
    usd_date: str = Field("", description="When the price was read (YYYY-MM).", json_schema_extra=UNCALIBRATED)
    cpu_tflops: FiniteFloat | None = Field(
        None, gt=0, description="Host FP32 TFLOP/s; required when `gpu` is null (the CPU profile's figure is "
        "data: hardware_profiles/cpu.yaml).", json_schema_extra=NODE_FACT)
    cpu_bandwidth_tbs: FiniteFloat = Field(0.02, gt=0,
                                           description="Host memory bandwidth, TB/s; used when `gpu` is null.",
                                           json_schema_extra=NODE_FACT)
    calibrated: dict[str, FiniteFloat] = Field(
        default_factory=dict, description="Measured factors written by `dflashx calibrate` and the pilot "
        "(serving_ratio: measured / predicted generation throughput; training_mfu: measured MFU; tau_probe_seconds: "
        "one held-out τ measurement; decode_cycle_seconds: one batched draft-verify cycle of it; ingest_seconds: the "
        "run's own ingest as the pilot ran it).",
        json_schema_extra=UNCALIBRATED
    )
    unknown: list[str] = Field(
        default_factory=list, description="Facts `hardware: local` could neither read nor look up (dotted keys, "
        "e.g. `gpu.bf16_tflops`); one given (an override) is known. The plan says what each changes.",
        json_schema_extra=UNCALIBRATED)

    @model_validator(mode="before")
    @classmethod
    def _table_and_unknowns(cls, data: Any) -> Any:
        """NVLink's bandwidth from the GPU table when the profile says NVLink and leaves the figure out; keys of
        `unknown` that hold a value (given by an override) dropped."""
        if not isinstance(data, dict):
            return data
        gpu = data.get("gpu")
        model = gpu_model(gpu["name"]) if isinstance(gpu, dict) and isinstance(gpu.get("name"), str) else None
        several = isinstance(data.get("gpus_per_node"), int) and data["gpus_per_node"] > 1
        nvlink = several and str(data.get("interconnect", "")).lower().startswith("nvlink")
        if nvlink and "interconnect_gbs" not in data and model is not None and model.nvlink_gbs is not None:
            data = data | {"interconnect_gbs": model.nvlink_gbs}
        if isinstance(data.get("unknown"), list):
            data = data | {"unknown": [k for k in data["unknown"] if _value(data, str(k)) is None]}
        return data

    @model_validator(mode="after")
    def _cpu_peak_given(self) -> "HardwareProfile":
        if self.gpu is None and self.cpu_tflops is None:
            raise key_problem("cpu_tflops", "a profile without a GPU (gpu: null) needs cpu_tflops, the host's FP32 "
                              "TFLOP/s", "add `cpu_tflops:` to the profile (the cpu profile says 0.1)")
        return self

    @property
    def peak_flops(self) -> float:
        """Dense peak FLOP/s of one device: the GPU's BF16 datasheet figure (unknown: the table's slowest,
        `GpuSpec.priced_bf16_tflops`), else the host's `cpu_tflops`."""
        tflops = self.gpu.priced_bf16_tflops if self.gpu is not None else self.cpu_tflops
        assert tflops is not None  # _cpu_peak_given
        return tflops * 1e12

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_node * self.nodes


def _value(data: dict[str, Any], dotted: str) -> Any:
    """The value at `gpu.bf16_tflops`-style `dotted` in a profile's raw mapping (None when absent)."""
    node: Any = data
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node
