# rlpulse's worker and exporter (and every other command) for compose/docker-compose.yml:
#   docker build -t rlpulse .        (from the repository root)
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /opt/rlpulse
COPY pyproject.toml README.md ./
COPY rlpulse ./rlpulse
# rlpulse/local/kafka links to compose/kafka (the local broker's files, package data).
COPY compose/kafka ./compose/kafka
RUN pip install ".[streams]" \
    && useradd --create-home --uid 1000 rlpulse \
    && mkdir -p /home/rlpulse/.cache/rlpulse && chown -R rlpulse /home/rlpulse/.cache
USER rlpulse
ENV RLPULSE_HOME=/home/rlpulse/.cache/rlpulse
ENTRYPOINT ["rlpulse"]
CMD ["--help"]
