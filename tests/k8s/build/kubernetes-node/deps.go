//go:build tools

// Package deps pins the node's Kubernetes commands this module builds (go build
// k8s.io/kubernetes/cmd/kubelet ...): go mod tidy keeps what they need. A module
// apart from ../kubernetes so that the control plane's cached build stays valid.
package deps

import (
	_ "k8s.io/kubernetes/cmd/kube-proxy/app"
	_ "k8s.io/kubernetes/cmd/kubelet/app"
)
