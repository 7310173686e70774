# Sourced by the scripts: where builds and caches go. Override any of these in the environment.
export WCM_CACHE_DIR=${WCM_CACHE_DIR:-$HOME/.cache/wasm-controller-manager}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
# The plugins built by scripts/build-plugins.
export WCM_PLUGIN_ARTIFACTS=${WCM_PLUGIN_ARTIFACTS:-$CARGO_TARGET_DIR/wasm32-wasip2/plugin}
