# Simulated vLLM backends (H100/MI300X performance models), so a GPU-less cluster can be tried.
#   docker build -f deploy/docker/sim.Dockerfile -t switchyard-sim:dev .
# One container is one simulated vLLM server (`python -m backends.sim`); it needs nothing beyond the
# gateway's own dependencies, so it installs the same package.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY deploy/constraints.txt deploy/constraints.txt
COPY gateway gateway
COPY backends backends
COPY policies policies
COPY loadtest loadtest
RUN python -m venv /opt/switchyard && /opt/switchyard/bin/pip install --no-cache-dir --disable-pip-version-check -c deploy/constraints.txt ".[sim]"

FROM python:3.11-slim
RUN useradd --system --uid 10001 --user-group --no-create-home switchyard
COPY --from=build /opt/switchyard /opt/switchyard
ENV PATH=/opt/switchyard/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request as u; sys.exit(u.urlopen('http://127.0.0.1:8000/health', timeout=2).status != 200)"]
ENTRYPOINT ["python", "-m", "backends.sim"]
CMD ["--host", "0.0.0.0", "--port", "8000", "--model", "llama-3.1-8b", "--gpu", "h100-sxm5"]
