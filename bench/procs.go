package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// procs is every process the comparison started that may still run; killAll ends them all, on a normal
// exit, a failure or a signal alike.
var procs = struct {
	mu  sync.Mutex
	all map[*proc]bool
}{all: map[*proc]bool{}}

// proc is one node's process: started from its command line, SIGKILLed on request or at exit.
type proc struct {
	name    string
	argv    []string
	logPath string
	cmd     *exec.Cmd
	exited  chan struct{}
}

// start runs p's command line (again, after kill), its output appended to its log file.
func (p *proc) start() error {
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(p.argv[0], p.argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = nodeEnv()
	// Should the comparison itself be SIGKILLed, the kernel kills its nodes too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	p.cmd, p.exited = cmd, exited
	procs.mu.Lock()
	procs.all[p] = true
	procs.mu.Unlock()
	return nil
}

// nodeEnv is this process's environment less the variables that configure etcd or leased (ETCD_*,
// LEASED_*): every node is configured by its command line alone.
func nodeEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ETCD_") && !strings.HasPrefix(kv, "LEASED_") {
			env = append(env, kv)
		}
	}
	return env
}

// kill SIGKILLs p and waits until it is gone (at most 10 s: a process in uninterruptible sleep may take a
// moment). A process never started or already gone is left alone.
func (p *proc) kill() {
	if p.cmd == nil {
		return
	}
	select {
	case <-p.killAsync():
	case <-time.After(10 * time.Second):
	}
	p.forget()
}

// killAsync sends SIGKILL and returns a channel closed when p has exited.
func (p *proc) killAsync() <-chan struct{} {
	_ = p.cmd.Process.Kill()
	return p.exited
}

// terminate sends SIGTERM (a clean stop) and returns a channel closed when p has exited.
func (p *proc) terminate() <-chan struct{} {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	return p.exited
}

// forget takes an exited p off the list of processes killed at the bench's end.
func (p *proc) forget() {
	procs.mu.Lock()
	delete(procs.all, p)
	procs.mu.Unlock()
}

// pid is p's process id (0 when not started).
func (p *proc) pid() int {
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// running reports whether p's process has not exited.
func (p *proc) running() bool {
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// killAll SIGKILLs every process still registered.
func killAll() {
	procs.mu.Lock()
	all := make([]*proc, 0, len(procs.all))
	for p := range procs.all {
		all = append(all, p)
	}
	procs.mu.Unlock()
	for _, p := range all {
		p.kill()
	}
}

// freePorts returns n distinct free loopback ports (listened on and closed again; the nodes bind them
// moments later).
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// clockTicks is the unit of utime and stime in /proc/<pid>/stat (USER_HZ, 100 on Linux).
const clockTicks = 100

// cpuSeconds is the CPU time (user + system) a process has used so far, from /proc/<pid>/stat.
func cpuSeconds(pid int) (float64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name, field 2, is in parentheses and may hold spaces: count fields after the last ')'.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	utime, err1 := strconv.ParseFloat(fields[11], 64) // field 14 of stat
	stime, err2 := strconv.ParseFloat(fields[12], 64) // field 15
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad utime or stime", pid)
	}
	return (utime + stime) / clockTicks, nil
}

// rssBytes is a process's resident set size, VmRSS of /proc/<pid>/status.
func rssBytes(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmRSS", pid)
}
