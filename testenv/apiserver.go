package main

import (
	"encoding/base64"
	"fmt"
	"os"

	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

// apiserverRole is the hidden first argument with which this binary runs as kube-apiserver.
const apiserverRole = "__kube-apiserver"

func runAPIServer(args []string) int {
	cmd := app.NewAPIServerCommand()
	cmd.SetArgs(args)
	if err := cmd.Execute(); err != nil {
		fmt.Fprintf(os.Stderr, "kube-apiserver: %v\n", err)
		return 1
	}
	return 0
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
