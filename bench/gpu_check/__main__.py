"""`python -m bench.gpu_check`: see bench/gpu_check/main.py."""

import sys

from bench.gpu_check.main import main

sys.exit(main())
