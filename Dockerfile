# Training image: CUDA PyTorch with the project installed; the entry point is `python -m project.train`.
#   docker build -t lightning-shards .                          # --build-arg EXTRAS=tune,export for those tools
#   docker run --rm --gpus all --ipc=host -v "$PWD/data:/app/data" -v "$PWD/logs:/app/logs" lightning-shards
# The base image brings Python 3.11, torch, torchvision and CUDA 12.8. For an older host driver, pick another
# pytorch/pytorch tag with torch>=2.6: --build-arg BASE_IMAGE=pytorch/pytorch:2.6.0-cuda12.4-cudnn9-runtime
ARG BASE_IMAGE=pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime
FROM ${BASE_IMAGE}

ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /app

# The user that trains. Give it your own uid (--build-arg UID=$(id -u)) to write to bind-mounted folders.
ARG UID=1000
RUN useradd --create-home --no-log-init --uid "$UID" trainer

# Dependencies from pyproject.toml alone, so this layer is rebuilt only when they change. The base
# image's torch and torchvision are pinned as constraints: pip keeps them instead of fetching another build.
ARG EXTRAS=""
COPY pyproject.toml scripts/requirements.py ./
RUN python requirements.py "$EXTRAS" > /tmp/requirements.txt \
    && pip list --format=freeze | grep -iE '^(torch|torchvision)==' > /tmp/constraints.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt -c /tmp/constraints.txt \
    && rm requirements.py /tmp/requirements.txt /tmp/constraints.txt

# The source, installed in place: project/cli.py finds configs/ next to project/, here in /app.
# Compiled now, since the user cannot write __pycache__ into the root-owned source.
COPY . .
RUN pip install --no-cache-dir --no-deps --editable . \
    && python -m compileall -q project \
    && mkdir -p data logs \
    && chown trainer:trainer data logs

USER ${UID}
# data/demo is built here on first use; runs go to logs/<experiment>/version_N/
VOLUME ["/app/data", "/app/logs"]
ENTRYPOINT ["python", "-m", "project.train"]
