# The Daedalus image for the control plane (API, control-queue worker). GPU host workers install
# `daedalus[vllm]` on the host itself, next to the engines they build and run.
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends git && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY src ./src
COPY examples ./examples
RUN pip install --no-cache-dir .
ENTRYPOINT ["daedalus"]
