package main

import (
	"bytes"
	"errors"
	"io"
	"net/netip"
	"os"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/coinexport/export/services/shop-schema/internal/guard"
)

// egressPolicy is the part of a NetworkPolicy this test reads.
type egressPolicy struct {
	Kind     string
	Metadata struct{ Name string }
	Spec     struct {
		Egress []struct {
			To []struct {
				IPBlock *struct {
					CIDR   string
					Except []string
				} `yaml:"ipBlock"`
			}
		}
	}
}

// shopEgress returns the ipBlocks through which deploy/k8s lets
// shop-schema reach addresses (shop-schema-calls-public-shops-only).
func shopEgress(t *testing.T) (allowed []netip.Prefix, except [][]netip.Prefix) {
	t.Helper()
	manifest, err := os.ReadFile("../../deploy/k8s/export-service.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(manifest))
	for {
		var p egressPolicy
		err := dec.Decode(&p)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if p.Kind != "NetworkPolicy" || p.Metadata.Name != "shop-schema-calls-public-shops-only" {
			continue
		}
		for _, rule := range p.Spec.Egress {
			for _, to := range rule.To {
				if to.IPBlock == nil {
					continue
				}
				allowed = append(allowed, netip.MustParsePrefix(to.IPBlock.CIDR))
				var ex []netip.Prefix
				for _, e := range to.IPBlock.Except {
					ex = append(ex, netip.MustParsePrefix(e))
				}
				except = append(except, ex)
			}
		}
	}
	if len(allowed) == 0 {
		t.Fatal("no ipBlock in NetworkPolicy shop-schema-calls-public-shops-only: the test would pass on nothing")
	}
	return allowed, except
}

// TestNetworkPolicyRefusesWhatReachesPrivateAddresses: the NetworkPolicy,
// the line behind the guard (README, "Address policy"), lets no address
// through that reaches the cluster's own networks, written directly or in
// an IPv6 form that a translator on the way turns into one: NAT64's
// local-use prefix 64:ff9b:1::/48 (RFC 8215), which a cluster's own NAT64
// uses, was let through where the well-known 64:ff9b::/96 was not.
func TestNetworkPolicyRefusesWhatReachesPrivateAddresses(t *testing.T) {
	allowed, except := shopEgress(t)
	g, err := guard.New(guard.DefaultPorts, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{
		"10.0.0.1", "172.16.0.1", "192.168.1.1", "127.0.0.1", "0.0.0.0", "169.254.169.254", "100.100.100.200",
		"::1", "fd00:ec2::254", "fe80::1", "::ffff:10.0.0.1",
		"64:ff9b::a00:1", "64:ff9b::a9fe:a9fe", // NAT64, well-known prefix
		"64:ff9b:1::a00:1", "64:ff9b:1:ffff::a9fe:a9fe", // NAT64, local-use prefix
	} {
		a := netip.MustParseAddr(s)
		if g.CheckAddr(a, 443) == nil {
			t.Fatalf("the guard allows %s: not an address this test should name", a)
		}
		for i, p := range allowed {
			if p.Contains(a) && !containedInAny(except[i], a) {
				t.Errorf("NetworkPolicy shop-schema-calls-public-shops-only lets %s through (ipBlock %s)", a, p)
			}
		}
	}
}

func containedInAny(prefixes []netip.Prefix, a netip.Addr) bool {
	for _, p := range prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
