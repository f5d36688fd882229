# syntax=docker/dockerfile:1
# KAI Scheduler image: a slim Python runtime with only the scheduler and its runtime
# dependencies, running as a non-root user.
#   docker build -t kai-scheduler:0.1.0 .
#   docker run --rm kai-scheduler:0.1.0 --help

# ---- build: install the package and its runtime dependencies into a virtualenv ----
FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/kai-scheduler
COPY pyproject.toml README.md ./
COPY scheduler ./scheduler
# Only the runtime dependencies from pyproject.toml: no [dev] extra, no build tools kept.
RUN /opt/kai-scheduler/bin/pip install --no-cache-dir . \
    && /opt/kai-scheduler/bin/pip uninstall --yes pip setuptools wheel

# ---- runtime ----
FROM python:3.11-slim-bookworm
LABEL org.opencontainers.image.title="kai-scheduler" \
      org.opencontainers.image.description="Kubernetes scheduler for AI/ML GPU workloads" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/kai-scheduler/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# A fixed numeric uid/gid so Kubernetes' runAsNonRoot can verify it without /etc/passwd.
RUN groupadd --system --gid 65532 kai \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin kai
COPY --from=build /opt/kai-scheduler /opt/kai-scheduler
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["kai-scheduler"]
CMD ["run"]
