package redisserver

import (
	"os/exec"
	"syscall"
)

// setDeathSignal kills the server when the process that started it dies.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
