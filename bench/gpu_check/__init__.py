"""The GPU check: one command that, on a GPU machine with a bare CUDA PyTorch image, installs what
the image lacks from wheels brought along, prints the environment, runs the benchmarks issue 24
names against the bounds measured in the same run (and transformers on the same GPU), the CUDA
test suite and a profile summary, and writes one report (markdown and JSON), within a time budget.

Modules: plan.py (the stages: commands and time caps, for a GPU or a `--tiny` CPU dry run),
runner.py (each stage a subprocess under the budget: a failure or a timeout is recorded and the
next stage runs), findings.py (figures read back from the stages' output, against the targets),
report.py (markdown and JSON), main.py (arguments, the run). Stage programs: environment.py,
install.py, profile_steps.py, serve_stage.py (+ random_server.py), suite_stage.py. The orchestration itself is
standard library only: it must start before anything is installed.
"""
