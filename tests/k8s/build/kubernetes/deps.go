//go:build tools

// Package deps pins the Kubernetes commands this module builds (go build
// k8s.io/kubernetes/cmd/kube-apiserver ...): go mod tidy keeps what they need.
package deps

import (
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	_ "k8s.io/kubectl/pkg/cmd"
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	_ "k8s.io/kubernetes/cmd/kube-scheduler/app"
)
