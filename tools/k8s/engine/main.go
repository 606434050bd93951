// Command engine is the test image's server: an inference engine stand-in for the real-node test
// layer. Run as "kill" (a symlink) it is a small kill(1), so `kubectl exec pod -- kill -USR1 1`
// works without a shell.
//
//	GET /healthz             200 "ok" while healthy, 503 otherwise (a readiness probe's target)
//	GET /health?ok=false     makes /healthz fail (ok=true heals it)
//	GET /exit?code=N         replies, then exits with code N
//	GET /                    "engine pid=<pid> host=<hostname>"
//	SIGUSR1 / SIGUSR2        exit 1 / exit 0 (a crash / a completion)
//	SIGTERM / SIGINT         exit 0 after TERM_DELAY_SECONDS (default 1); a negative delay ignores it
//
// It listens on :$PORT (default 8080) and exits 3 if it cannot.
package main

import (
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	if filepath.Base(os.Args[0]) == "kill" {
		os.Exit(killCommand(os.Args[1:]))
	}
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	go handleSignals(termDelay())
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	var healthy atomic.Bool
	healthy.Store(true)
	http.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if !healthy.Load() {
			http.Error(w, "unhealthy", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	http.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
		ok := r.URL.Query().Get("ok") != "false"
		healthy.Store(ok)
		log.Printf("health set to %v", ok)
		fmt.Fprintf(w, "healthy=%v\n", ok)
	})
	http.HandleFunc("/exit", func(w http.ResponseWriter, r *http.Request) {
		code, err := strconv.Atoi(r.URL.Query().Get("code"))
		if err != nil {
			http.Error(w, "code must be an integer", http.StatusBadRequest)
			return
		}
		log.Printf("exiting with code %d on request", code)
		fmt.Fprintf(w, "exiting %d\n", code)
		go func() {
			time.Sleep(50 * time.Millisecond)
			os.Exit(code)
		}()
	})
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		host, _ := os.Hostname()
		fmt.Fprintf(w, "engine pid=%d host=%s\n", os.Getpid(), host)
	})
	log.Printf("listening on :%s", port)
	if err := http.ListenAndServe(":"+port, nil); err != nil {
		log.Printf("cannot listen: %v", err)
		os.Exit(3)
	}
}

func termDelay() time.Duration {
	raw := os.Getenv("TERM_DELAY_SECONDS")
	if raw == "" {
		return time.Second
	}
	seconds, err := strconv.ParseFloat(raw, 64)
	if err != nil {
		log.Printf("TERM_DELAY_SECONDS=%q is not a number; using 1", raw)
		return time.Second
	}
	return time.Duration(seconds * float64(time.Second))
}

func handleSignals(delay time.Duration) {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR1, syscall.SIGUSR2)
	for sig := range signals {
		switch sig {
		case syscall.SIGUSR1:
			log.Printf("SIGUSR1: exiting 1")
			os.Exit(1)
		case syscall.SIGUSR2:
			log.Printf("SIGUSR2: exiting 0")
			os.Exit(0)
		default:
			if delay < 0 {
				log.Printf("%v: ignored (TERM_DELAY_SECONDS < 0)", sig)
				continue
			}
			log.Printf("%v: exiting 0 in %v", sig, delay)
			go func() {
				time.Sleep(delay)
				os.Exit(0)
			}()
		}
	}
}

var signalNames = map[string]syscall.Signal{
	"TERM": syscall.SIGTERM, "KILL": syscall.SIGKILL, "INT": syscall.SIGINT,
	"USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2, "HUP": syscall.SIGHUP,
}

func killCommand(args []string) int {
	sig := syscall.SIGTERM
	if len(args) > 0 && strings.HasPrefix(args[0], "-") {
		name := strings.TrimPrefix(strings.ToUpper(args[0][1:]), "SIG")
		if n, err := strconv.Atoi(name); err == nil {
			sig = syscall.Signal(n)
		} else if s, ok := signalNames[name]; ok {
			sig = s
		} else {
			fmt.Fprintf(os.Stderr, "kill: unknown signal %s\n", args[0])
			return 2
		}
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: kill [-SIGNAL] PID...")
		return 2
	}
	status := 0
	for _, arg := range args {
		pid, err := strconv.Atoi(arg)
		if err == nil {
			err = syscall.Kill(pid, sig)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "kill %s: %v\n", arg, err)
			status = 1
		}
	}
	return status
}
