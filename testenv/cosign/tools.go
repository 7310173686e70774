//go:build tools

// The real cosign CLI (sigstore/cosign v2), built for the tests: it signs artifacts pushed to the
// test registry with a key pair it generates, as an operator would, so the host's verification is
// checked against what cosign itself writes.
package tools

import _ "github.com/sigstore/cosign/v2/cmd/cosign"
