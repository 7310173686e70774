# syntax=docker/dockerfile:1
#
# The manager (release build) and the shipped plugins, on a distroless base, as manifests/host.yaml
# runs it: non-root (65532), read-only root filesystem, `run --plugins-dir=/plugins
# --compile-cache=/var/cache/wcm/compiled`.
#
#   docker build -t wasm-controller-manager:latest .
#
# Needs BuildKit (cache mounts). What the image holds: docs/deploying.md.

# Debian 12 for the build, so the binary's glibc is the one distroless cc-debian12 ships.
ARG RUST_IMAGE=rust:1.95.0-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

FROM ${RUST_IMAGE} AS source
WORKDIR /src
# The whole workspace: Cargo.lock pins every member's dependencies, so each member's manifest
# (and its targets) must be there even when only one package is built. wit/ is the contract
# that the host and the guest SDK generate their bindings from.
COPY Cargo.toml Cargo.lock ./
COPY wit wit
COPY host host
COPY guest-sdk guest-sdk
COPY plugins plugins
COPY testenv/support testenv/support

FROM source AS host
# The target dir is a cache mount (kept between builds, not in the layer), so the binary is
# copied out of it in the same step.
RUN --mount=type=cache,id=wcm-cargo-registry,target=/usr/local/cargo/registry \
    --mount=type=cache,id=wcm-cargo-git,target=/usr/local/cargo/git \
    --mount=type=cache,id=wcm-target-host,target=/src/target \
    cargo build --release -p wasm-controller-manager --locked \
 && install -D -m 0755 target/release/wasm-controller-manager /out/wasm-controller-manager \
 && mkdir -p /out/empty

FROM ${RUST_IMAGE} AS plugins
# Before the sources, so a source change does not download the target again.
RUN rustup target add wasm32-wasip2
WORKDIR /src
COPY --from=source /src/ ./
# As scripts/build-plugins, for the two shipped plugins only (not the test plugins).
RUN --mount=type=cache,id=wcm-cargo-registry,target=/usr/local/cargo/registry \
    --mount=type=cache,id=wcm-cargo-git,target=/usr/local/cargo/git \
    --mount=type=cache,id=wcm-target-plugins,target=/src/target \
    cargo build --locked --target wasm32-wasip2 --profile plugin -p pod-counter -p network --lib \
 && mkdir -p /out \
 && cp target/wasm32-wasip2/plugin/pod_counter.wasm target/wasm32-wasip2/plugin/network.wasm /out/

FROM ${RUNTIME_IMAGE}
COPY --from=host /out/wasm-controller-manager /usr/local/bin/wasm-controller-manager
# Every shipped plugin, to copy from (`docker cp`, an initContainer) and to inspect or generate RBAC
# for in the Pod (`kubectl exec`); the host does not load this directory.
COPY --from=plugins /out/ /opt/wasm-controller-manager/plugins-available/
# What runs by default: pod-counter, which needs no settings. A copy, not a symlink: the host
# refuses a link that leads out of --plugins-dir. network needs a network.toml and a Secret, so
# it stays available only.
COPY --from=plugins /out/pod_counter.wasm /plugins/pod_counter.wasm
# The compile cache, writable by the runtime user when no volume is mounted on it (docker run).
COPY --from=host --chown=65532:65532 /out/empty/ /var/cache/wcm/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/wasm-controller-manager"]
CMD ["run", "--plugins-dir=/plugins", "--compile-cache=/var/cache/wcm/compiled"]
