"""Recipe schema: a hardware profile (`hardware`, or `dflashx/hardware_profiles/NAME.yaml`): facts
about the node, never settings."""

# No `from __future__ import annotations` here: pydantic would evaluate every field's string
# annotation when the class is created, which `dflashx plan`'s start-up pays (benchmarks/cli_latency.py).

from pydantic import Field, model_validator

from dflashx.config.fields import UNCALIBRATED, FiniteFloat, Strict, calibrates, key_problem

# A fact of the node: a pilot's serving and training figures were measured on it (dflashx.plan.calibration).
NODE_FACT = calibrates("serving", "training")


class GpuSpec(Strict):
    name: str = Field(description="GPU model, e.g. `H200`.")
    memory_gb: FiniteFloat = Field(gt=0, description="Per-GPU memory, GB (1e9 bytes).")
    bandwidth_tbs: FiniteFloat = Field(gt=0, description="Per-GPU memory bandwidth, TB/s.")
    bf16_tflops: FiniteFloat = Field(gt=0, description="Dense BF16 TFLOP/s (not the sparse headline).")
    fp8_tflops: FiniteFloat | None = Field(None, gt=0, description="Dense FP8 TFLOP/s; null = no FP8.")


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
        default_factory=dict, description="Measured factors written by `dflashx calibrate` (serving_ratio: "
        "measured / predicted generation throughput; training_mfu: measured MFU).", json_schema_extra=UNCALIBRATED
    )

    @model_validator(mode="after")
    def _cpu_peak_given(self) -> "HardwareProfile":
        if self.gpu is None and self.cpu_tflops is None:
            raise key_problem("cpu_tflops", "a profile without a GPU (gpu: null) needs cpu_tflops, the host's FP32 "
                              "TFLOP/s", "add `cpu_tflops:` to the profile (the cpu profile says 0.1)")
        return self

    @property
    def peak_flops(self) -> float:
        """Dense peak FLOP/s of one device: the GPU's BF16 datasheet figure, else the host's `cpu_tflops`."""
        tflops = self.gpu.bf16_tflops if self.gpu is not None else self.cpu_tflops
        assert tflops is not None  # _cpu_peak_given
        return tflops * 1e12

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_node * self.nodes
