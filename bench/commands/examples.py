"""One example per subcommand, printed last in its `--help` (a test checks every subcommand has one).

A subcommand whose parser sets its own epilog (`bench catalog`) keeps it.
"""

EXAMPLES = {
    "list": "bench list experiments/resnet50.toml --profile cuda",
    "run": "bench run experiments/smoke.toml",
    "data": "bench data make --images 256",
    "data make": "bench data make --images 256",
    "compare": "bench compare results/resnet50/predicted results/resnet50/<device-tag>",
    "report": "bench report results/resnet50/cpu-amd-epyc-f25m17-avx512bf16-2c",
    "cost": "bench cost results/resnet50/predicted --provider aws",
    "plan": "bench plan vit_large_patch16_224 --effective-batch 4096 --image-size 224",
    "predict": "bench predict experiments/resnet50.toml --gpu H100-80GB",
    "estimate": "bench estimate experiments/resnet50.toml",
    "probe": "bench probe resnet50 --gpu A100-40GB --precision bf16",
    "measure": "bench measure resnet50 --micro-batch 32 --accum 4 --precision bf16 --checkpointing full --optimizer adamw8bit",
    "equivalence": "bench equivalence resnet50 --effective-batch 32 --accum 4",
    "claims": "bench claims --results results",
    "peak": "bench peak --device cpu",
}
