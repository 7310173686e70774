//! Prints the Foo CRD (JSON, which `kubectl apply -f` reads):
//! `cargo run --example crd > foo-crd.json`.

fn main() {
    #[cfg(not(target_arch = "wasm32"))]
    {
        use kube::CustomResourceExt;
        let crd = sample_controller::Foo::crd();
        println!(
            "{}",
            serde_json::to_string_pretty(&crd).expect("a CRD serializes")
        );
    }
}
