//! `not-a-plugin`: a valid wasm32-wasip2 component of another world (a command: it exports
//! `wasi:cli/run`, not the reconciler). The host must refuse it with a clear error.

fn main() {
    println!("not a plugin");
}
