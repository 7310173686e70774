//! The CRD shipped in `manifests/crds/` (which the test cluster and `scripts/run-local` install) is
//! the one the `Foo` type derives. Regenerate it with
//! `cargo run -p sample-controller --example sample-controller-crd > manifests/crds/foos.samplecontroller.k8s.io.json`.

use kube::CustomResourceExt;

#[test]
fn the_shipped_crd_is_the_derived_one() {
    let shipped: serde_json::Value = serde_json::from_str(include_str!(
        "../../../manifests/crds/foos.samplecontroller.k8s.io.json"
    ))
    .expect("the shipped CRD is JSON");
    let derived = serde_json::to_value(sample_controller::Foo::crd()).expect("serializes");
    assert_eq!(
        shipped, derived,
        "manifests/crds/foos.samplecontroller.k8s.io.json is not what Foo derives; regenerate it \
         with `cargo run -p sample-controller --example sample-controller-crd`"
    );
    assert_eq!(
        derived["spec"]["versions"][0]["subresources"]["status"],
        serde_json::json!({})
    );
}
