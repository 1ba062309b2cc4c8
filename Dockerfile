# The dpproxy image. The build stage builds wheels of this project and of every dependency
# (`pip wheel .`, from the same pyproject.toml the tests install with `pip install -e .`)
# and installs them into /install; the runtime stage copies that into a slim Python and
# runs `dpproxy` as a non-root user.
#
#   docker build -t dpproxy .
#   docker run -v "$PWD/policy.yaml:/etc/dpproxy/policy.yaml:ro" -p 6432:6432 dpproxy
#
# Mount the policy at /etc/dpproxy/policy.yaml and TLS material wherever listen.tls of the
# policy names it (e.g. /etc/dpproxy/tls). The SQLite ledger, if the policy uses one, belongs
# on a volume at /var/lib/dpproxy (the working directory). See docs/deployment.md.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
# binutils only for strip below; the build stage is thrown away, so its version does not matter.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends binutils \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY proxy proxy
COPY policies policies
COPY rewriter rewriter
COPY mechanisms mechanisms
# dpproxy's own wheel, offline from /wheels: the versions are pyproject.toml's.
# hadolint ignore=DL3013
RUN pip wheel --wheel-dir /wheels . \
 && pip install --no-index --find-links /wheels --prefix /install dpproxy
# OpenDP's library ships with its symbol tables (~260 MB); stripped it is ~170 MB.
RUN find /install -path '*/opendp/lib/*.so' -exec strip --strip-unneeded {} +

FROM ${PYTHON_IMAGE} AS runtime
ENV PYTHONUNBUFFERED=1
COPY --from=build /install /usr/local
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/dpproxy --shell /usr/sbin/nologin dpproxy \
 && install -d -o dpproxy -g dpproxy -m 0750 /etc/dpproxy /var/lib/dpproxy \
 && dpproxy --help > /dev/null
USER 10001:10001
WORKDIR /var/lib/dpproxy
EXPOSE 6432 9187
# Docker's default stop timeout (10 s) is shorter than listen.shutdown_grace_s (30 s):
# stop with `docker stop -t 40`, or compose's stop_grace_period.
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=6s --start-period=30s --retries=3 \
    CMD ["dpproxy", "health", "--host", "127.0.0.1", "--port", "6432", "--timeout", "5"]
ENTRYPOINT ["dpproxy"]
CMD ["serve", "-c", "/etc/dpproxy/policy.yaml"]
