// Command pause is the node's sandbox ("pause") image: it holds a Pod's namespaces and does
// nothing else. No image registry can be reached from the test machines, so the node builds it.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	// PID 1 of the sandbox: reap what gets re-parented to us, exit on SIGTERM/SIGINT.
	child := make(chan os.Signal, 1)
	signal.Notify(child, syscall.SIGCHLD)
	for {
		select {
		case <-sigs:
			os.Exit(0)
		case <-child:
			for {
				var ws syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
		}
	}
}
