//! `many-watches`: a hostile plugin that declares as many Pod watches as the contract allows, each
//! with its own label selector, to make the host open one list+watch stream per watch.
//!
//! By default it declares 33 (the primary and 32 secondaries) with the selectors `a!=1` … `a!=33`:
//! each matches nearly every Pod, so each would be a stream and a cache copy of every Pod. The
//! config key `selectors` replaces them: the selectors separated by `|`, the first the primary's
//! (e.g. `a=1,b=2|b=2, a=1` for selectors written differently). `namespace` limits every watch to
//! one namespace. Secondaries map each Pod to its own key; reconciles do nothing.

use k8s_openapi::api::core::v1::Pod;
use wcm_sdk::{Action, Context, Description, Error, Mapping, Reconciler, Request, Watch};

/// The primary and the 32 secondaries the contract allows.
const HOSTILE_WATCHES: usize = 33;

struct ManyWatches;

fn selectors() -> Vec<String> {
    match wcm_sdk::describe_config("selectors") {
        Some(list) => list.split('|').map(str::to_string).collect(),
        None => (1..=HOSTILE_WATCHES).map(|i| format!("a!={i}")).collect(),
    }
}

impl Reconciler for ManyWatches {
    fn describe() -> Description {
        let namespace = wcm_sdk::describe_config("namespace");
        let watch = |selector: &str| {
            let w = Watch::of::<Pod>().label_selector(selector);
            match &namespace {
                Some(ns) => w.namespace(ns),
                None => w,
            }
        };
        let selectors = selectors();
        let mut d = Description::new("many-watches", test_plugins::VERSION)
            .config_key("selectors")
            .config_key("namespace");
        let mut all = selectors.iter();
        if let Some(first) = all.next() {
            d = d.primary(watch(first));
        }
        for s in all {
            d = d.secondary(watch(s), Mapping::SameKey);
        }
        d
    }

    fn reconcile(_ctx: &Context, _req: Request) -> Result<Action, Error> {
        Ok(Action::done())
    }
}

wcm_sdk::export_plugin!(ManyWatches);
