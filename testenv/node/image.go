package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// imageSpec describes a one-layer image: the files it holds and how it runs. The tests build the
// product image from the release build with it (host/tests/common/image.rs), and the node its
// pause image.
type imageSpec struct {
	// The image name, e.g. "wasm-controller-manager:latest" (normalized as containerd does).
	Name       string      `json:"name"`
	Entrypoint []string    `json:"entrypoint"`
	Cmd        []string    `json:"cmd"`
	User       string      `json:"user"`
	Env        []string    `json:"env"`
	WorkingDir string      `json:"working_dir"`
	Files      []imageFile `json:"files"`
}

// imageFile is one entry of the layer: a file copied from Source (symlinks followed), a file with
// Content, or a directory (Dir). Parent directories are made root-owned 0755.
type imageFile struct {
	Path    string  `json:"path"`
	Source  string  `json:"source,omitempty"`
	Content *string `json:"content,omitempty"`
	Dir     bool    `json:"dir,omitempty"`
	Mode    int64   `json:"mode"`
	UID     int     `json:"uid"`
	GID     int     `json:"gid"`
}

func runImage(args []string) int {
	if len(args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: testenv-node image SPEC.json OUT.tar")
		return 2
	}
	b, err := os.ReadFile(args[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "testenv-node image: %v\n", err)
		return 1
	}
	var spec imageSpec
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&spec); err != nil {
		fmt.Fprintf(os.Stderr, "testenv-node image: %s: %v\n", args[0], err)
		return 1
	}
	if err := writeImage(spec, args[1]); err != nil {
		fmt.Fprintf(os.Stderr, "testenv-node image: %v\n", err)
		return 1
	}
	return 0
}

// normalizeName turns a short image reference into the full name containerd and the kubelet use.
func normalizeName(name string) string {
	first, _, hasSlash := strings.Cut(name, "/")
	if hasSlash && (strings.ContainsAny(first, ".:") || first == "localhost") {
		return name
	}
	if !hasSlash {
		name = "library/" + name
	}
	if !strings.Contains(path.Base(name), ":") && !strings.Contains(name, "@") {
		name += ":latest"
	}
	return "docker.io/" + name
}

var epoch = time.Unix(0, 0)

func layerTar(files []imageFile) ([]byte, error) {
	entries := map[string]imageFile{}
	for _, f := range files {
		p := path.Clean("/" + f.Path)
		if p == "/" {
			continue
		}
		f.Path = p
		entries[p] = f
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if _, ok := entries[d]; !ok {
				entries[d] = imageFile{Path: d, Dir: true, Mode: 0o755}
			}
		}
	}
	paths := make([]string, 0, len(entries))
	for p := range entries {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		f := entries[p]
		hdr := &tar.Header{Name: strings.TrimPrefix(p, "/"), Mode: f.Mode, Uid: f.UID, Gid: f.GID, ModTime: epoch, Format: tar.FormatPAX}
		if f.Dir {
			hdr.Typeflag = tar.TypeDir
			hdr.Name += "/"
			if err := tw.WriteHeader(hdr); err != nil {
				return nil, err
			}
			continue
		}
		var body []byte
		switch {
		case f.Content != nil:
			body = []byte(*f.Content)
		case f.Source != "":
			b, err := os.ReadFile(f.Source)
			if err != nil {
				return nil, err
			}
			body = b
		default:
			return nil, fmt.Errorf("%s: neither source, content nor dir", p)
		}
		hdr.Typeflag = tar.TypeReg
		hdr.Size = int64(len(body))
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    map[string]string `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// writeImage writes spec as an OCI image layout archive (oci-layout, index.json, blobs/) with one
// uncompressed layer, named for `ctr images import` by the index's io.containerd.image.name.
func writeImage(spec imageSpec, out string) error {
	layer, err := layerTar(spec.Files)
	if err != nil {
		return err
	}
	layerDigest := digestOf(layer)
	imgConfig := map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"created":      epoch.UTC().Format(time.RFC3339),
		"config": map[string]any{
			"User":       spec.User,
			"Entrypoint": spec.Entrypoint,
			"Cmd":        spec.Cmd,
			"Env":        spec.Env,
			"WorkingDir": spec.WorkingDir,
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
	}
	configJSON, err := json.Marshal(imgConfig)
	if err != nil {
		return err
	}
	manifest := map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        descriptor{MediaType: "application/vnd.oci.image.config.v1+json", Digest: digestOf(configJSON), Size: int64(len(configJSON))},
		"layers":        []descriptor{{MediaType: "application/vnd.oci.image.layer.v1.tar", Digest: layerDigest, Size: int64(len(layer))}},
	}
	manifestJSON, err := json.Marshal(manifest)
	if err != nil {
		return err
	}
	full := normalizeName(spec.Name)
	tag := full[strings.LastIndex(full, ":")+1:]
	index := map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests": []descriptor{{
			MediaType: "application/vnd.oci.image.manifest.v1+json",
			Digest:    digestOf(manifestJSON),
			Size:      int64(len(manifestJSON)),
			Platform:  map[string]string{"architecture": "amd64", "os": "linux"},
			Annotations: map[string]string{
				"io.containerd.image.name":          full,
				"org.opencontainers.image.ref.name": tag,
			},
		}},
	}
	indexJSON, err := json.Marshal(index)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	f, err := os.Create(out + ".tmp")
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	put := func(name string, body []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), ModTime: epoch, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := tw.Write(body)
		return err
	}
	blob := func(b []byte) string { return "blobs/sha256/" + strings.TrimPrefix(digestOf(b), "sha256:") }
	for _, e := range []struct {
		name string
		body []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", indexJSON},
		{blob(manifestJSON), manifestJSON},
		{blob(configJSON), configJSON},
		{blob(layer), layer},
	} {
		if err := put(e.name, e.body); err != nil {
			f.Close()
			return err
		}
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(out+".tmp", out)
}
