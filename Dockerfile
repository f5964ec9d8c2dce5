# The Tritonwatch image: `serve` (collector + alerts + API) and `dashboard` share it.
#
# The repository keeps its top-level folders (schemas/, collector/, ...); tritonwatch/<name> are
# relative symbolic links to them.  COPY keeps those links as links, so each folder is copied
# next to tritonwatch/ exactly as in the checkout, and the wheel build follows the links.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY schemas schemas
COPY collector collector
COPY store store
COPY alerts alerts
COPY api api
COPY dashboard dashboard
COPY tritonwatch tritonwatch
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
COPY --from=build /wheels /wheels
# The service user owns its data directory: the default SQLite store
# (sqlite:///tritonwatch-data/tritonwatch.db) is relative to the working directory, which is
# that directory.  It is a volume, so the data outlives the container.
RUN pip install --no-cache-dir /wheels/*.whl \
    && rm -rf /wheels \
    && groupadd --system --gid 10001 tritonwatch \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/tritonwatch \
        --no-create-home --shell /usr/sbin/nologin tritonwatch \
    && mkdir -p /var/lib/tritonwatch \
    && chown tritonwatch:tritonwatch /var/lib/tritonwatch
WORKDIR /var/lib/tritonwatch
VOLUME ["/var/lib/tritonwatch"]
USER 10001:10001
EXPOSE 8080
# /healthz answers 200 while the process serves.  The slim image has no curl: Python's urllib
# (a non-2xx answer or no answer raises, and the check fails).  It assumes --listen port 8080.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]
ENTRYPOINT ["tritonwatch"]
CMD ["serve", "--config", "/etc/tritonwatch/tritonwatch.yaml", "--listen", "0.0.0.0:8080"]
