package main

import (
	"fmt"
	"os"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// kustomizeRole is the first argument with which this binary renders a kustomization and exits,
// so the tests can check `kubectl apply -k` input on a machine without kubectl.
const kustomizeRole = "kustomize"

// runKustomize prints what `kubectl kustomize DIR` prints: the same library (kubectl 1.36
// vendors kustomize/api v0.21.1) with kubectl's defaults when no flag is given: load files only
// from inside the kustomization root, no plugins, no helm, the default resource order.
func runKustomize(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: testenv kustomize DIR")
		return 2
	}
	opts := krusty.MakeDefaultOptions()
	// kubectl leaves the order unspecified unless --reorder is given (the kustomization's
	// sortOptions, else the legacy order).
	opts.Reorder = krusty.ReorderOptionUnspecified
	m, err := krusty.MakeKustomizer(opts).Run(filesys.MakeFsOnDisk(), args[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "testenv kustomize: %v\n", err)
		return 1
	}
	out, err := m.AsYaml()
	if err != nil {
		fmt.Fprintf(os.Stderr, "testenv kustomize: %v\n", err)
		return 1
	}
	if _, err := os.Stdout.Write(out); err != nil {
		fmt.Fprintf(os.Stderr, "testenv kustomize: write: %v\n", err)
		return 1
	}
	return 0
}
