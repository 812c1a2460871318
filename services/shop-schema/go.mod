module github.com/coinexport/export/services/shop-schema

go 1.26.0

require github.com/coinexport/export/pkg v0.0.0

require (
	code.dny.dev/ssrf v0.3.0 // indirect
	golang.org/x/net v0.61.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
)

replace github.com/coinexport/export/pkg => ../../pkg
