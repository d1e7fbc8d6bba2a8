module github.com/kvreshard/kvreshard

go 1.26.0

require (
	github.com/alecthomas/participle/v2 v2.1.4
	github.com/dave/jennifer v1.7.1
	github.com/redis/rueidis v1.0.79
	github.com/stretchr/testify v1.12.1
	github.com/zeebo/xxh3 v1.1.0
	golang.org/x/sys v0.49.0
	golang.org/x/tools v0.52.0
)

require (
	github.com/klauspost/cpuid/v2 v2.2.10 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/mod v0.42.0 // indirect
	golang.org/x/net v0.61.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
)
