# The Switchyard gateway: a slim runtime image (no compilers, no dev or test tools), running as non-root.
#   docker build -f deploy/docker/gateway.Dockerfile -t switchyard:dev .
# The install step is exactly what tests/cluster/test_images.py runs in a fresh virtualenv.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY deploy/constraints.txt deploy/constraints.txt
COPY gateway gateway
COPY backends backends
COPY policies policies
COPY loadtest loadtest
RUN python -m venv /opt/switchyard && /opt/switchyard/bin/pip install --no-cache-dir --disable-pip-version-check -c deploy/constraints.txt .

FROM python:3.11-slim
RUN useradd --system --uid 10001 --user-group --no-create-home switchyard
COPY --from=build /opt/switchyard /opt/switchyard
ENV PATH=/opt/switchyard/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
EXPOSE 8080 8081
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request as u; sys.exit(u.urlopen('http://127.0.0.1:8080/health', timeout=2).status != 200)"]
ENTRYPOINT ["switchyard"]
CMD ["serve", "--config", "/etc/switchyard/gateway.yaml", "--host", "0.0.0.0"]
