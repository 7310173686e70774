//! Prints the Network CRD generated from the Rust type, as shipped in `manifests/crds/`:
//! `cargo run -p network --example crd > manifests/crds/networks.samplecrd.k8s.io.yaml`.
//! (A native tool: in the wasm build of the workspace's examples it does nothing.)

fn main() {
    #[cfg(not(target_arch = "wasm32"))]
    print!("{}", network::types::crd_yaml());
}
