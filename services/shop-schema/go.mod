module github.com/coinexport/export/services/shop-schema

go 1.26

require github.com/coinexport/export/pkg v0.0.0

replace github.com/coinexport/export/pkg => ../../pkg
