"""h3app benchmarks: ratios against diffusers + PEFT and against the file-read limit, measured in one run.

``python -m bench [--quick] [--only P1,P3]``; see docs/performance.md.
"""
