//! Cosign signatures of a Plugin's artifact, checked offline against the operator's public keys
//! (`spec.verify.publicKeys`): nothing is asked of a transparency log or a certificate authority.
//!
//! The format is the one `cosign sign --key` writes to the registry: a manifest tagged
//! `sha256-HEX.sig` in the artifact's repository, whose layers are "simple signing" payloads
//! (`application/vnd.dev.cosign.simplesigning.v1+json`), each with its signature (ECDSA P-256 over
//! SHA-256 of the payload, DER, base64) in the annotation `dev.cosignproject.cosign/signature`.
//! A payload names the signed manifest in `critical.image.docker-manifest-digest`. The artifact is
//! verified when one payload that names its manifest carries a valid signature by one of the keys.
//!
//! Everything read here comes from the registry and is bounded before use: at most
//! `MAX_SIGNATURES` layers, each payload at most `MAX_PAYLOAD` bytes.

use p256::ecdsa::signature::Verifier;
use p256::ecdsa::{Signature, VerifyingKey};
use p256::pkcs8::DecodePublicKey;

/// Layer media type of a cosign signature payload.
pub const PAYLOAD_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// Annotation holding a payload's signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// The `critical.type` of a cosign payload.
const COSIGN_TYPE: &str = "cosign container image signature";
pub const MAX_KEYS: usize = 8;
const MAX_KEY_PEM: usize = 4096;
pub const MAX_SIGNATURES: usize = 16;
pub const MAX_PAYLOAD: u64 = 64 << 10;

/// The operator's public keys for one Plugin.
#[derive(Clone)]
pub struct TrustedKeys {
    keys: Vec<VerifyingKey>,
}

impl std::fmt::Debug for TrustedKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TrustedKeys({} keys)", self.keys.len())
    }
}

impl PartialEq for TrustedKeys {
    fn eq(&self, other: &Self) -> bool {
        self.keys == other.keys
    }
}

impl Eq for TrustedKeys {}

impl TrustedKeys {
    /// Keys in PEM (`-----BEGIN PUBLIC KEY-----`, as `cosign generate-key-pair` writes
    /// `cosign.pub`): ECDSA P-256 only.
    pub fn parse(pems: &[String]) -> Result<TrustedKeys, String> {
        if pems.len() > MAX_KEYS {
            return Err(format!(
                "verify.publicKeys: at most {MAX_KEYS} keys, not {}",
                pems.len()
            ));
        }
        let mut keys = Vec::with_capacity(pems.len());
        for (i, pem) in pems.iter().enumerate() {
            if pem.len() > MAX_KEY_PEM {
                return Err(format!(
                    "verify.publicKeys[{i}]: longer than {MAX_KEY_PEM} characters"
                ));
            }
            let key = VerifyingKey::from_public_key_pem(pem.trim()).map_err(|_| {
                format!(
                    "verify.publicKeys[{i}]: not an ECDSA P-256 public key in PEM (cosign generate-key-pair writes one in cosign.pub)"
                )
            })?;
            keys.push(key);
        }
        Ok(TrustedKeys { keys })
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }
}

/// The tag cosign stores the signatures of manifest `sha256:HEX` under.
pub fn signature_tag(manifest_digest_hex: &str) -> String {
    format!("sha256-{manifest_digest_hex}.sig")
}

/// One signed payload a signature manifest lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedPayload {
    pub digest_hex: String,
    pub size: u64,
    pub signature_b64: String,
}

/// The signed payloads of a cosign signature manifest (layers of another media type, or without
/// a signature, are skipped; more than `MAX_SIGNATURES` layers, or a payload declared larger than
/// `MAX_PAYLOAD`, refuse the manifest).
pub fn signed_payloads(sig_manifest: &[u8]) -> Result<Vec<SignedPayload>, String> {
    let v: serde_json::Value = serde_json::from_slice(sig_manifest)
        .map_err(|_| "the signature manifest is not JSON".to_string())?;
    let layers = v["layers"]
        .as_array()
        .ok_or("the signature manifest has no layers")?;
    if layers.len() > MAX_SIGNATURES {
        return Err(format!(
            "the signature manifest has {} layers, more than {MAX_SIGNATURES}",
            layers.len()
        ));
    }
    let mut out = Vec::new();
    for l in layers {
        if l["mediaType"] != PAYLOAD_TYPE {
            continue;
        }
        let Some(sig) = l["annotations"][SIGNATURE_ANNOTATION].as_str() else {
            continue;
        };
        let size = l["size"].as_u64().unwrap_or(u64::MAX);
        if size > MAX_PAYLOAD {
            return Err(format!(
                "a signature payload is declared {size} bytes, more than {MAX_PAYLOAD}"
            ));
        }
        let hex = l["digest"]
            .as_str()
            .and_then(|d| d.strip_prefix("sha256:"))
            .filter(|h| {
                h.len() == 64
                    && h.bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            })
            .ok_or("a signature payload's digest is not sha256:<64 hex digits>")?;
        if sig.len() > 1024 {
            return Err("a signature annotation is longer than 1024 characters".into());
        }
        out.push(SignedPayload {
            digest_hex: hex.to_string(),
            size,
            signature_b64: sig.to_string(),
        });
    }
    Ok(out)
}

/// Ok when `signature_b64` is a valid signature of `payload` by one of `keys` (its index) and the
/// payload is a cosign payload naming `sha256:manifest_digest_hex`. The caller has checked the
/// payload's bytes against their digest.
pub fn verify_payload(
    keys: &TrustedKeys,
    payload: &[u8],
    signature_b64: &str,
    manifest_digest_hex: &str,
) -> Result<usize, String> {
    use base64::Engine as _;
    let der = base64::engine::general_purpose::STANDARD
        .decode(signature_b64.trim())
        .map_err(|_| "a signature is not base64".to_string())?;
    let signature =
        Signature::from_der(&der).map_err(|_| "a signature is not a DER ECDSA signature")?;
    let by = keys
        .keys
        .iter()
        .position(|k| k.verify(payload, &signature).is_ok())
        .ok_or("a signature was made by none of verify.publicKeys")?;
    let v: serde_json::Value =
        serde_json::from_slice(payload).map_err(|_| "a signed payload is not JSON".to_string())?;
    if v["critical"]["type"] != COSIGN_TYPE {
        return Err("a signed payload is not a cosign container image signature".into());
    }
    let named = v["critical"]["image"]["docker-manifest-digest"]
        .as_str()
        .unwrap_or_default();
    if named != format!("sha256:{manifest_digest_hex}") {
        return Err(format!(
            "a valid signature is of another manifest ({}), not this one",
            crate::contract::validate::log_text(named, 80)
        ));
    }
    Ok(by)
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;
    use p256::ecdsa::SigningKey;
    use p256::ecdsa::signature::Signer;
    use p256::pkcs8::EncodePublicKey;

    const D: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn key(seed: u8) -> (SigningKey, String) {
        let sk = SigningKey::from_slice(&[seed; 32]).unwrap();
        let pem = sk
            .verifying_key()
            .to_public_key_pem(p256::pkcs8::LineEnding::LF)
            .unwrap();
        (sk, pem)
    }

    fn payload(digest: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "critical": {"identity": {"docker-reference": "reg.example/a"},
                         "image": {"docker-manifest-digest": format!("sha256:{digest}")},
                         "type": COSIGN_TYPE},
            "optional": null,
        }))
        .unwrap()
    }

    fn sign(sk: &SigningKey, p: &[u8]) -> String {
        let sig: Signature = sk.sign(p);
        base64::engine::general_purpose::STANDARD.encode(sig.to_der().as_bytes())
    }

    #[test]
    fn a_payload_signed_by_a_trusted_key_for_this_manifest_verifies() {
        let (sk, pem) = key(7);
        let (_, other_pem) = key(9);
        let keys = TrustedKeys::parse(&[other_pem, pem]).unwrap();
        let p = payload(D);
        assert_eq!(verify_payload(&keys, &p, &sign(&sk, &p), D), Ok(1));
    }

    #[test]
    fn forged_tampered_and_misdirected_signatures_are_refused() {
        let (sk, pem) = key(7);
        let (stranger, _) = key(8);
        let keys = TrustedKeys::parse(&[pem]).unwrap();
        let p = payload(D);
        let e = verify_payload(&keys, &p, &sign(&stranger, &p), D).unwrap_err();
        assert!(e.contains("none of"), "{e}");
        let mut tampered = p.clone();
        tampered[10] ^= 1;
        assert!(verify_payload(&keys, &tampered, &sign(&sk, &p), D).is_err());
        let other = payload(&"f".repeat(64));
        let e = verify_payload(&keys, &other, &sign(&sk, &other), D).unwrap_err();
        assert!(e.contains("another manifest"), "{e}");
        assert!(verify_payload(&keys, &p, "not base64!", D).is_err());
        assert!(verify_payload(&keys, &p, "AAAA", D).is_err());
        let not_cosign = b"{\"critical\":{}}".to_vec();
        let e = verify_payload(&keys, &not_cosign, &sign(&sk, &not_cosign), D).unwrap_err();
        assert!(e.contains("not a cosign"), "{e}");
    }

    #[test]
    fn only_p256_keys_in_pem_and_a_bounded_number_are_accepted() {
        assert!(TrustedKeys::parse(&["not a key".into()]).is_err());
        // A P-384 key (another curve).
        let p384 = "-----BEGIN PUBLIC KEY-----\nMHYwEAYHKoZIzj0CAQYFK4EEACIDYgAEYuFqp1gfg/y/D80mnBZNoi3cDxYd3nVm\n8gy/zEZ3XtkItNoWPAywolTiJUZxWwJStDmsrKmj8ByelNieaCz+lxT2zBwn866u\ntS0UgUz3TNFMcLP7Dew/tJTrQN0LSL7H\n-----END PUBLIC KEY-----\n";
        assert!(TrustedKeys::parse(&[p384.into()]).is_err());
        let (_, pem) = key(7);
        assert!(TrustedKeys::parse(&vec![pem; MAX_KEYS + 1]).is_err());
        assert!(TrustedKeys::parse(&["x".repeat(MAX_KEY_PEM + 1)]).is_err());
    }

    #[test]
    fn signature_manifests_are_read_within_bounds() {
        let layer = |mt: &str, size: u64, sig: Option<&str>| {
            let mut l =
                serde_json::json!({"mediaType": mt, "size": size, "digest": format!("sha256:{D}")});
            if let Some(s) = sig {
                l["annotations"] = serde_json::json!({SIGNATURE_ANNOTATION: s});
            }
            l
        };
        let m = |layers: Vec<serde_json::Value>| {
            serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "layers": layers})).unwrap()
        };
        let got = signed_payloads(&m(vec![
            layer(PAYLOAD_TYPE, 200, Some("c2ln")),
            layer("application/octet-stream", 10, Some("x")),
            layer(PAYLOAD_TYPE, 10, None),
        ]))
        .unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].signature_b64, "c2ln");
        assert!(
            signed_payloads(&m(vec![layer(PAYLOAD_TYPE, MAX_PAYLOAD + 1, Some("x"))])).is_err()
        );
        assert!(
            signed_payloads(&m(vec![
                layer(PAYLOAD_TYPE, 1, Some("x"));
                MAX_SIGNATURES + 1
            ]))
            .is_err()
        );
        assert!(signed_payloads(b"nope").is_err());
        assert_eq!(signature_tag(D), format!("sha256-{D}.sig"));
    }

    /// Made by the real cosign v2.6.5 (`cosign generate-key-pair`, then `cosign sign --key
    /// cosign.key --tlog-upload=false` of a component pushed to the test registry): the test
    /// `cosign_sign_writes_the_signature_tag_with_a_simple_signing_payload_to_the_registry` in
    /// testenv/support/tests/registry.rs writes them with `WCM_COSIGN_FIXTURE_DIR` set.
    mod real_cosign {
        use super::*;
        use sha2::{Digest, Sha256};

        const PUBLIC_KEY: &str = include_str!("../../../tests/fixtures/cosign/cosign.pub");
        const SIG_MANIFEST: &[u8] =
            include_bytes!("../../../tests/fixtures/cosign/signature-manifest.json");
        const PAYLOAD: &[u8] = include_bytes!("../../../tests/fixtures/cosign/payload.json");
        const SIGNED_DIGEST: &str = include_str!("../../../tests/fixtures/cosign/signed-digest");
        /// openssl-made keys of kinds cosign can also make but the host does not take.
        const RSA_KEY: &str = include_str!("../../../tests/fixtures/cosign/rsa-2048.pub");
        const P384_KEY: &str = include_str!("../../../tests/fixtures/cosign/p384.pub");

        fn signed_hex() -> &'static str {
            SIGNED_DIGEST.trim().strip_prefix("sha256:").unwrap()
        }

        fn keys() -> TrustedKeys {
            TrustedKeys::parse(&[PUBLIC_KEY.to_string()]).unwrap()
        }

        fn the_payload() -> SignedPayload {
            let mut all = signed_payloads(SIG_MANIFEST).unwrap();
            assert_eq!(all.len(), 1, "{all:?}");
            all.remove(0)
        }

        fn one_line(e: String) -> String {
            assert!(!e.contains('\n') && !e.is_empty(), "not one line: {e:?}");
            e
        }

        #[test]
        fn a_real_cosign_signature_of_this_manifest_by_the_trusted_key_verifies() {
            let p = the_payload();
            assert_eq!(format!("{:x}", Sha256::digest(PAYLOAD)), p.digest_hex);
            assert_eq!(p.size, PAYLOAD.len() as u64);
            assert_eq!(
                verify_payload(&keys(), PAYLOAD, &p.signature_b64, signed_hex()),
                Ok(0)
            );
            // Also when the key is one of several.
            let (_, other) = key(3);
            let two = TrustedKeys::parse(&[other, PUBLIC_KEY.to_string()]).unwrap();
            assert_eq!(
                verify_payload(&two, PAYLOAD, &p.signature_b64, signed_hex()),
                Ok(1)
            );
        }

        #[test]
        fn a_real_signature_does_not_verify_another_manifest() {
            let p = the_payload();
            let other = format!("{:x}", Sha256::digest(b"another component"));
            let e =
                one_line(verify_payload(&keys(), PAYLOAD, &p.signature_b64, &other).unwrap_err());
            assert!(e.contains("another manifest"), "{e}");
            assert!(e.contains(signed_hex()), "{e}");
        }

        #[test]
        fn a_real_signature_is_refused_under_another_key_and_a_tampered_payload_is_refused() {
            let p = the_payload();
            let (_, stranger) = key(8);
            let strangers = TrustedKeys::parse(&[stranger]).unwrap();
            let e = one_line(
                verify_payload(&strangers, PAYLOAD, &p.signature_b64, signed_hex()).unwrap_err(),
            );
            assert!(e.contains("none of verify.publicKeys"), "{e}");
            // The digest it names swapped for another: the signature no longer covers it.
            let other = format!("{:x}", Sha256::digest(b"another component"));
            let swapped = String::from_utf8(PAYLOAD.to_vec())
                .unwrap()
                .replace(signed_hex(), &other);
            assert_ne!(swapped.as_bytes(), PAYLOAD);
            let e = one_line(
                verify_payload(&keys(), swapped.as_bytes(), &p.signature_b64, &other).unwrap_err(),
            );
            assert!(e.contains("none of verify.publicKeys"), "{e}");
            // A signature made by the attacker's key over the swapped payload: not trusted.
            let (attacker, _) = key(9);
            let forged = sign(&attacker, swapped.as_bytes());
            let e =
                one_line(verify_payload(&keys(), swapped.as_bytes(), &forged, &other).unwrap_err());
            assert!(e.contains("none of verify.publicKeys"), "{e}");
        }

        #[test]
        fn garbage_in_the_signature_annotation_is_refused() {
            for garbage in ["%%%not base64%%%", "", "AAAA", "MEUCIQ=="] {
                let e =
                    one_line(verify_payload(&keys(), PAYLOAD, garbage, signed_hex()).unwrap_err());
                assert!(
                    e.contains("base64") || e.contains("DER"),
                    "{garbage:?}: {e}"
                );
            }
            // A valid signature in base64 of another encoding (raw r||s, not DER).
            use base64::Engine as _;
            let raw = base64::engine::general_purpose::STANDARD.encode([7u8; 64]);
            assert!(verify_payload(&keys(), PAYLOAD, &raw, signed_hex()).is_err());
        }

        #[test]
        fn rsa_and_p384_public_keys_are_refused_with_a_clear_message() {
            for (what, pem) in [("RSA", RSA_KEY), ("P-384", P384_KEY)] {
                assert!(pem.starts_with("-----BEGIN PUBLIC KEY-----"), "{what}");
                let e = one_line(TrustedKeys::parse(&[PUBLIC_KEY.into(), pem.into()]).unwrap_err());
                assert!(
                    e.starts_with("verify.publicKeys[1]:") && e.contains("ECDSA P-256"),
                    "{what}: {e}"
                );
            }
        }

        #[test]
        fn a_real_signature_manifest_with_too_many_or_oversize_layers_is_refused() {
            let m: serde_json::Value = serde_json::from_slice(SIG_MANIFEST).unwrap();
            let layer = m["layers"][0].clone();
            let mut many = m.clone();
            many["layers"] = serde_json::Value::Array(vec![layer.clone(); MAX_SIGNATURES + 1]);
            let e = one_line(signed_payloads(&serde_json::to_vec(&many).unwrap()).unwrap_err());
            assert!(e.contains("more than 16"), "{e}");
            let mut just = m.clone();
            just["layers"] = serde_json::Value::Array(vec![layer.clone(); MAX_SIGNATURES]);
            assert_eq!(
                signed_payloads(&serde_json::to_vec(&just).unwrap())
                    .unwrap()
                    .len(),
                MAX_SIGNATURES
            );
            let mut big = m.clone();
            big["layers"][0]["size"] = serde_json::json!(MAX_PAYLOAD + 1);
            let e = one_line(signed_payloads(&serde_json::to_vec(&big).unwrap()).unwrap_err());
            assert!(e.contains("more than 65536"), "{e}");
            let mut unsized_layer = m.clone();
            unsized_layer["layers"][0]["size"] = serde_json::json!("12");
            assert!(signed_payloads(&serde_json::to_vec(&unsized_layer).unwrap()).is_err());
            // A layer of another media type is skipped, not read.
            let mut other_type = m;
            other_type["layers"][0]["mediaType"] = serde_json::json!("application/octet-stream");
            assert_eq!(
                signed_payloads(&serde_json::to_vec(&other_type).unwrap()),
                Ok(vec![])
            );
        }
    }
}
