// CoreDNS with only the plugins the tier's Corefile uses (tests/k8s/node.py): the
// release's full set (cloud DNS providers, etcd, ...) is most of its build time.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The order plugins run in, as CoreDNS's plugin.cfg has them.
func init() {
	dnsserver.Directives = []string{"bind", "ready", "health", "errors", "loadbalance", "cache", "kubernetes"}
}

func main() { coremain.Run() }
