package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"
)

// Media types of the two layouts a wasm component is pushed in.
const (
	// CNCF TAG Runtime's wasm OCI artifact (wgs/wasm/deliverables/wasm-oci-artifact).
	cncfConfigType = "application/vnd.wasm.config.v0+json"
	cncfLayerType  = "application/wasm"
	// The older layout of wasm-to-oci, kwctl and oci-client's WASM_* constants.
	oldConfigType = "application/vnd.wasm.config.v1+json"
	oldLayerType  = "application/vnd.wasm.content.layer.v1+wasm"
)

type pushOptions struct {
	registry, repo, tag, wasm, layout string
	ca, username, password, storage   string
	os                                string
	plainHTTP, jsonOut                bool
	// Broken artifacts, for failure tests.
	twoLayers      bool
	layerMediaType string
	hugeLayer      int64
	claimSize      int64
	deleteLayer    bool
	corruptLayer   bool
}

// pushed is what push --json prints.
type pushed struct {
	Digest       string   `json:"digest"`
	Reference    string   `json:"reference"`
	Size         int64    `json:"size"`
	ConfigDigest string   `json:"config_digest"`
	LayerDigests []string `json:"layer_digests"`
	LayerSizes   []int64  `json:"layer_sizes"`
}

func runPush(args []string) int {
	fs := flag.NewFlagSet("push", flag.ContinueOnError)
	var o pushOptions
	fs.StringVar(&o.registry, "registry", "", "registry host:port (required)")
	fs.StringVar(&o.repo, "repo", "", "repository, e.g. plugins/pod-counter (required)")
	fs.StringVar(&o.tag, "tag", "latest", "tag to push the manifest under")
	fs.StringVar(&o.wasm, "wasm", "", "the .wasm component to push (required)")
	fs.StringVar(&o.layout, "layout", "cncf", `"cncf" (application/wasm layer, application/vnd.wasm.config.v0+json config) or "wasm-to-oci" (application/vnd.wasm.content.layer.v1+wasm, application/vnd.wasm.config.v1+json)`)
	fs.StringVar(&o.os, "os", "wasip2", "the config's os (cncf layout)")
	fs.StringVar(&o.ca, "ca", "", "PEM CA to trust for the registry's TLS certificate")
	fs.BoolVar(&o.plainHTTP, "plain-http", false, "talk plain HTTP")
	fs.StringVar(&o.username, "username", "", "basic auth user")
	fs.StringVar(&o.password, "password", "", "basic auth password")
	fs.BoolVar(&o.jsonOut, "json", false, "print a JSON object (digest, config and layer digests) instead of the digest")
	fs.BoolVar(&o.twoLayers, "two-wasm-layers", false, "broken: push a second wasm layer (the component with a custom section appended)")
	fs.StringVar(&o.layerMediaType, "layer-media-type", "", "broken: give the layer this media type instead of the layout's")
	fs.Int64Var(&o.hugeLayer, "huge-layer", 0, "broken: the layer is the component padded with zeros to this many bytes (streamed, never held in memory)")
	fs.Int64Var(&o.claimSize, "claim-layer-size", 0, "broken: the manifest claims the layer has this size (the blob is the real one)")
	fs.BoolVar(&o.deleteLayer, "delete-layer", false, "broken: after the push, delete the layer blob from the repository (the manifest stays); the layer is the component with a unique custom section, so nothing else shares the blob")
	fs.BoolVar(&o.corruptLayer, "corrupt-layer", false, "broken: after the push, flip a byte of the stored layer blob, keeping its size (needs --storage); the layer is made unique as for --delete-layer")
	fs.StringVar(&o.storage, "storage", "", "the serving registry's storage directory (its ready line's \"storage\"), for --corrupt-layer")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if o.registry == "" || o.repo == "" || o.wasm == "" {
		fmt.Fprintln(os.Stderr, "testenv-registry push: --registry, --repo and --wasm are required")
		return 2
	}
	if o.corruptLayer && o.storage == "" {
		fmt.Fprintln(os.Stderr, "testenv-registry push: --corrupt-layer needs --storage")
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	out, err := push(ctx, o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testenv-registry push: %v\n", err)
		return 1
	}
	if o.jsonOut {
		b, _ := json.Marshal(out)
		fmt.Println(string(b))
	} else {
		fmt.Println(out.Digest)
	}
	return 0
}

// blob is content to push: in memory, or a generated stream (the huge layer).
type blob struct {
	desc ocispec.Descriptor
	data []byte
	open func() io.Reader
}

func (b blob) reader() io.Reader {
	if b.open != nil {
		return b.open()
	}
	return bytes.NewReader(b.data)
}

func memBlob(mediaType string, data []byte) blob {
	return blob{desc: ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(data), Size: int64(len(data))}, data: data}
}

// paddedBlob is wasm followed by zeros up to size bytes; its digest is computed by streaming.
func paddedBlob(mediaType string, wasm []byte, size int64) (blob, error) {
	if size < int64(len(wasm)) {
		return blob{}, fmt.Errorf("--huge-layer %d is smaller than the component (%d bytes)", size, len(wasm))
	}
	open := func() io.Reader {
		return io.MultiReader(bytes.NewReader(wasm), io.LimitReader(zeros{}, size-int64(len(wasm))))
	}
	h := sha256.New()
	if _, err := io.Copy(h, open()); err != nil {
		return blob{}, err
	}
	d := digest.NewDigestFromBytes(digest.SHA256, h.Sum(nil))
	return blob{desc: ocispec.Descriptor{MediaType: mediaType, Digest: d, Size: size}, open: open}, nil
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func push(ctx context.Context, o pushOptions) (*pushed, error) {
	wasm, err := os.ReadFile(o.wasm)
	if err != nil {
		return nil, err
	}
	if o.deleteLayer || o.corruptLayer {
		// The storage keeps one copy of a blob for every repository: break a copy of the
		// component that nothing else shares.
		wasm = withCustomSection(wasm, "wcm-testenv-unique", []byte(randomHex(16)))
	}
	var configType, layerType string
	switch o.layout {
	case "cncf":
		configType, layerType = cncfConfigType, cncfLayerType
	case "wasm-to-oci":
		configType, layerType = oldConfigType, oldLayerType
	default:
		return nil, fmt.Errorf("--layout %q: want cncf or wasm-to-oci", o.layout)
	}
	if o.layerMediaType != "" {
		layerType = o.layerMediaType
	}

	var layers []blob
	if o.hugeLayer > 0 {
		b, err := paddedBlob(layerType, wasm, o.hugeLayer)
		if err != nil {
			return nil, err
		}
		layers = append(layers, b)
	} else {
		layers = append(layers, memBlob(layerType, wasm))
	}
	if o.twoLayers {
		layers = append(layers, memBlob(layerType, withCustomSection(wasm, "wcm-testenv-second-layer", []byte("a second, different component"))))
	}

	created := time.Now().UTC().Format(time.RFC3339)
	var config []byte
	if o.layout == "cncf" {
		imports, exports, err := componentWorld(wasm)
		if err != nil {
			fmt.Fprintf(os.Stderr, "testenv-registry push: %s: %v; the config lists no imports or exports\n", o.wasm, err)
			imports, exports = []string{}, []string{}
		}
		digests := make([]string, len(layers))
		for i, l := range layers {
			digests[i] = l.desc.Digest.String()
		}
		config, err = json.Marshal(map[string]any{
			"created":      created,
			"architecture": "wasm",
			"os":           o.os,
			"layerDigests": digests,
			"component": map[string]any{
				"imports": imports,
				"exports": exports,
				"target":  nil,
			},
		})
		if err != nil {
			return nil, err
		}
	} else {
		config = []byte("{}")
	}
	configBlob := memBlob(configType, config)

	manifest := ocispec.Manifest{
		MediaType:   ocispec.MediaTypeImageManifest,
		Config:      configBlob.desc,
		Annotations: map[string]string{ocispec.AnnotationCreated: created},
	}
	manifest.SchemaVersion = 2
	for _, l := range layers {
		d := l.desc
		d.Annotations = map[string]string{ocispec.AnnotationTitle: filepath.Base(o.wasm)}
		if o.claimSize > 0 {
			d.Size = o.claimSize
		}
		manifest.Layers = append(manifest.Layers, d)
	}
	manifestJSON, err := json.Marshal(manifest)
	if err != nil {
		return nil, err
	}
	manifestBlob := memBlob(ocispec.MediaTypeImageManifest, manifestJSON)

	repo, err := repository(o)
	if err != nil {
		return nil, err
	}
	for _, b := range append([]blob{configBlob}, layers...) {
		if err := repo.Blobs().Push(ctx, b.desc, b.reader()); err != nil {
			return nil, fmt.Errorf("push blob %s (%s): %w", b.desc.Digest, b.desc.MediaType, err)
		}
	}
	if err := repo.Manifests().PushReference(ctx, manifestBlob.desc, bytes.NewReader(manifestJSON), o.tag); err != nil {
		return nil, fmt.Errorf("push the manifest as %s: %w", o.tag, err)
	}
	layer := layers[0].desc.Digest
	if o.deleteLayer {
		if err := repo.Blobs().Delete(ctx, layers[0].desc); err != nil {
			return nil, fmt.Errorf("delete the layer %s: %w", layer, err)
		}
	}
	if o.corruptLayer {
		if err := corrupt(o.storage, layer); err != nil {
			return nil, err
		}
	}
	out := &pushed{
		Digest:       manifestBlob.desc.Digest.String(),
		Reference:    fmt.Sprintf("%s/%s@%s", o.registry, o.repo, manifestBlob.desc.Digest),
		Size:         manifestBlob.desc.Size,
		ConfigDigest: configBlob.desc.Digest.String(),
	}
	for _, l := range layers {
		out.LayerDigests = append(out.LayerDigests, l.desc.Digest.String())
		out.LayerSizes = append(out.LayerSizes, l.desc.Size)
	}
	return out, nil
}

func repository(o pushOptions) (*remote.Repository, error) {
	repo, err := remote.NewRepository(o.registry + "/" + o.repo)
	if err != nil {
		return nil, err
	}
	repo.PlainHTTP = o.plainHTTP
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.Proxy = nil // loopback only, whatever the environment says
	if o.ca != "" {
		pem, err := os.ReadFile(o.ca)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s holds no PEM certificate", o.ca)
		}
		transport.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	client := &auth.Client{Client: &http.Client{Transport: transport}, Cache: auth.NewCache()}
	if o.username != "" || o.password != "" {
		client.Credential = auth.StaticCredential(o.registry, auth.Credential{Username: o.username, Password: o.password})
	}
	repo.Client = client
	return repo, nil
}

// withCustomSection appends a custom section (id 0) to a wasm binary: still the same component,
// with a different digest.
func withCustomSection(wasm []byte, name string, payload []byte) []byte {
	body := append(leb(uint32(len(name))), name...)
	body = append(body, payload...)
	out := append(bytes.Clone(wasm), 0)
	out = append(out, leb(uint32(len(body)))...)
	return append(out, body...)
}

func leb(v uint32) []byte {
	var out []byte
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			out = append(out, c|0x80)
			continue
		}
		return append(out, c)
	}
}

// corrupt flips one byte in the middle of a stored blob, keeping its size: the registry serves it
// under the old digest, and only a client that checks the digest notices.
func corrupt(storage string, d digest.Digest) error {
	if d.Algorithm() != digest.SHA256 || strings.ContainsAny(d.Encoded(), "/.") {
		return errors.New("corrupt: not a sha256 digest")
	}
	hex := d.Encoded()
	path := filepath.Join(storage, "docker/registry/v2/blobs/sha256", hex[:2], hex, "data")
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("corrupt the layer: %w", err)
	}
	if len(data) == 0 {
		return errors.New("corrupt: the blob is empty")
	}
	data[len(data)/2] ^= 0xff
	return os.WriteFile(path, data, 0o644)
}
