# The Tritonwatch image: `serve` (collector + alerts + API) and `dashboard` share it.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY schemas schemas
COPY collector collector
COPY store store
COPY alerts alerts
COPY api api
COPY dashboard dashboard
COPY tritonwatch tritonwatch
RUN pip install --no-cache-dir . && useradd --system --uid 10001 tritonwatch
USER tritonwatch
EXPOSE 8080
ENTRYPOINT ["tritonwatch"]
CMD ["serve", "--config", "/etc/tritonwatch/tritonwatch.yaml", "--listen", "0.0.0.0:8080"]
