package bench

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
)

// Machine says where a run was measured: the figures are ratios against
// baselines of the same run, but which machine and which Redis server
// still decide how far they can go.
type Machine struct {
	CPU        string `json:"cpu,omitempty"` // model name, where the system says (Linux)
	CPUs       int    `json:"cpus"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	Go         string `json:"go"`
	OS         string `json:"os"`              // GOOS/GOARCH
	Redis      string `json:"redis,omitempty"` // the version of the redis-server on PATH
}

// ThisMachine describes the machine the process runs on.
func ThisMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), Go: runtime.Version(),
		OS: runtime.GOOS + "/" + runtime.GOARCH}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	// redis-server --version prints "Redis server v=7.0.15 sha=...".
	if out, err := exec.Command("redis-server", "--version").Output(); err == nil {
		for _, f := range strings.Fields(string(out)) {
			if v, ok := strings.CutPrefix(f, "v="); ok {
				m.Redis = v
			}
		}
	}
	return m
}

// String is the machine in one line, as the summary table prints it.
func (m Machine) String() string {
	s := fmt.Sprintf("%d CPUs", m.CPUs)
	if m.CPU != "" {
		s = m.CPU + ", " + s
	}
	s += fmt.Sprintf(", GOMAXPROCS %d, %s %s", m.GOMAXPROCS, m.Go, m.OS)
	if m.Redis != "" {
		s += ", redis-server " + m.Redis
	}
	return s
}
