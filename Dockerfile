# Archipelago's image: the web app, syncd and the Celery workers all run from it
# (compose.yaml gives each its command). PyTorch comes from PyTorch's own wheel
# index: the CPU build by default, a CUDA build when TORCH_INDEX_URL names one
# (the gpu profile in compose.yaml). pyproject.toml pins torch==2.13.0 either way.
FROM python:3.11-slim

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# First and alone, so that a code change does not download PyTorch again.
RUN pip install "torch==2.13.0" --index-url "$TORCH_INDEX_URL"

COPY pyproject.toml README.md ./
COPY webapp webapp
COPY diloco diloco
COPY trainer trainer
COPY syncd syncd
COPY bench bench
COPY templates templates
COPY manage.py ./
# Editable: the settings find templates/ and var/ beside the packages, in /app.
RUN pip install -e . \
    && useradd --create-home --uid 1000 archipelago \
    && mkdir -p /app/var /data/checkpoints /data/logs /data/corpora \
    && chown -R archipelago /app/var /data

USER archipelago
EXPOSE 8000
