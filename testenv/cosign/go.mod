module wasm-controller-manager/testenv/cosign

go 1.26

require github.com/sigstore/cosign/v2 v2.6.5 // indirect
