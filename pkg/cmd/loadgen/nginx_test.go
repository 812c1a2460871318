package main

import (
	"strings"
	"testing"
)

func TestNginxConfigRender(t *testing.T) {
	c := nginxConfig{Dir: "/tmp/bench", Listen: "127.0.0.1:18084", Upstream: "127.0.0.1:18081", Workers: "auto"}
	var b strings.Builder
	if err := c.render(&b); err != nil {
		t.Fatalf("render() error %v", err)
	}
	for _, want := range []string{
		"daemon off;",
		"pid /tmp/bench/nginx.pid;",
		"error_log /tmp/bench/nginx-error.log warn;",
		"server 127.0.0.1:18081;",
		"keepalive 512;",
		"listen 127.0.0.1:18084 reuseport;",
		"proxy_http_version 1.1;",
		`proxy_set_header Connection "";`,
		"access_log off;",
		"proxy_temp_path /tmp/bench/tmp/proxy;",
		"location = /v1/export/items {",
		"proxy_buffers 8 16k;",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("render() lacks %q:\n%s", want, b.String())
		}
	}
}

func TestNginxConfigRefusesDirectiveBreakers(t *testing.T) {
	for _, c := range []nginxConfig{
		{Dir: "/tmp/a; user root", Listen: "127.0.0.1:1", Upstream: "127.0.0.1:2", Workers: "auto"},
		{Dir: "/tmp/a", Listen: "127.0.0.1:1 }", Upstream: "127.0.0.1:2", Workers: "auto"},
		{Dir: "/tmp/a", Listen: "127.0.0.1:1", Upstream: "", Workers: "auto"},
		{Dir: "/tmp/a b", Listen: "127.0.0.1:1", Upstream: "127.0.0.1:2", Workers: "auto"},
	} {
		if err := c.render(&strings.Builder{}); err == nil {
			t.Errorf("render(%+v) = nil, want an error", c)
		}
	}
}
