// Kvreshard writes and reads KV-cache pages across TP, PP and memory layouts.
//
// Usage:
//
//	kvreshard demo  [--store URL]
//	kvreshard plan  --model M --src S --dst D [--json] [--repeat N]
//	                [--strategy direct|scatter|staged|auto] [--transport memory|file|redis|engine|rdma]
//	                [--max-segments N] [--stage-bytes N] [--max-gap N]
//	kvreshard write --store URL --model M --src S --pages N [--rank T/P] [--prefix P]
//	kvreshard read  --store URL --model M --dst D --pages N [--prefix P] [--verify] [--json]
//	                [--strategy S] [--copy-workers N] [--check-parts]
//	kvreshard bench [--quick] [--json] [--calibrate]
//
// M is a model: layers=12,kv-heads=4,head-dim=8[,v-head-dim=8],dtype=fp32,page=16
// (mla=1 for one latent component; name=, revision=, namespace= and
// fingerprint= enter the model domain). S is a writer topology:
// tp=1,pp=3,layout=PLHD[,pp-layers=5/4/3]. D is a reader rank:
// tp=2,pp=2,rank=1/0,layout=page_first[,pp-layers=..][,slots=N,slot=S].
// Layouts are the built-in ones (PLHD, LPHD, HPLD, page_first,
// page_first_direct, layer_first, page_head) and those of --kvl files.
// TP is at most 1024 and holds a KV head on at most 64 ranks; PP is at
// most the layer count. read puts page i in slot i of a pool of --pages
// slots; a part layout there means its pages one slot after another.
// read --check-parts checks every byte read against its part's checksums
// before it reaches the pool.
//
// plan prints one reader rank's plan for a strategy (direct by default;
// auto lets the cost model of --transport choose): its transport ops,
// their count, bytes and estimated time. In --json, ops are the transport
// operations: runs for direct; reads with their destination segments in
// dsts for scatter; staging reads (region "stage", dst the offset in the
// staging buffer, round the staging round) for staged, whose copy steps
// into the pool are in staging.copies.
//
// Malformed flags exit 2 with one message; failures exit 1. Counts are
// decimal, without sign or leading zero.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/kvreshard/kvreshard/runtime/store"

	_ "github.com/kvreshard/kvreshard/layouts"
)

func main() {
	os.Exit(run(hostEnv, os.Args[1:], os.Stdout, os.Stderr))
}

// env is what the commands take from where they run: how stores are
// opened, and the memory available to them. main runs them in hostEnv;
// tests give their own (a store that fails, a configured memory).
type env struct {
	open         func(ctx context.Context, url string) (store.Store, error)
	memAvailable func() int // bytes; 0 when unknown
}

// hostEnv is this machine's: store.Open, and MemAvailable of /proc/meminfo.
var hostEnv = env{open: store.Open, memAvailable: availableMemory}

const usage = `usage: kvreshard <command> [flags]

commands:
  demo    write pages with one topology and read them with others, verifying every byte
  plan    print the plan of one reader rank
  write   write pages to a store
  read    read pages from a store into a pool, and verify them
  bench   run the benchmark suite

run 'kvreshard <command> -h' for a command's flags
`

func run(e env, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmds := map[string]func(env, []string, io.Writer, io.Writer) error{
		"plan":  planCmd,
		"demo":  demoCmd,
		"write": writeCmd,
		"read":  readCmd,
		"bench": benchCmd,
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
			fmt.Fprint(stdout, usage)
			return 0
		}
		fmt.Fprintf(stderr, "kvreshard: unknown command %q\n%s", args[0], usage)
		return 2
	}
	err := cmd(e, args[1:], stdout, stderr)
	var ue *usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "kvreshard %s: %v\n", args[0], err)
		return 2
	case errors.Is(err, errFailed):
		return 1
	}
	fmt.Fprintf(stderr, "kvreshard %s: %v\n", args[0], err)
	return 1
}

var (
	errHelp   = errors.New("help shown")
	errFailed = errors.New("failed") // the command printed why
)
