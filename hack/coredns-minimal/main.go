// CoreDNS with the plugins the real-node tier's Corefile uses, and no others
// (crates/testenv/src/real_nodes/dns.rs: errors, health, ready, kubernetes, cache, loop).
// CoreDNS's own main (coredns.go) links every plugin, the cloud providers' SDKs among them:
// that build took several minutes of a cold CI run. hack/install-testenv.sh builds this
// file in a throwaway module against github.com/coredns/coredns at COREDNS_VERSION
// (hack/testenv-versions.env). A Corefile that names another plugin is refused at start
// ("unknown directive"): add its package below and its name to the list, in the order of
// CoreDNS's plugin.cfg.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The plugins in the order CoreDNS's plugin.cfg gives them, which is the order a query
// passes through them.
var directives = []string{
	"ready",
	"health",
	"errors",
	"cache",
	"kubernetes",
	"loop",
}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
