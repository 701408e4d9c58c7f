"""Fixed choices, one constant per fact. Validation messages list these, so a new choice is added here only."""

WORKFLOWS = ("t2va", "fl2va", "ref2va")
PARTITIONS = ("transformer", "transformer_ref")  # transformer_ref serves ref2va
REFERENCE_WORKFLOW = "ref2va"


def workflow_partition(workflow: str) -> str:
    """The transformer partition a (valid) workflow runs on: ``transformer_ref`` for ref2va, else ``transformer``."""
    return PARTITIONS[1] if workflow == REFERENCE_WORKFLOW else PARTITIONS[0]
LORA_MODES = ("unmerged", "merged")
QKV_LAYOUTS = ("auto", "blocked", "interleaved")
OFFLOAD_MODES = ("none", "auto", "group")
# dtype names accepted on the command line and in the UI → torch dtype attribute names
DTYPE_NAMES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16"}
