package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/oklog/run"
)

// errStopped is the error of a part that returned nil while the process was
// still running: a part that stops on its own ends the process, and says so.
var errStopped = errors.New("stopped on its own")

// runGroup runs a process's long-lived parts (servers, consumers, appliers,
// the rule watcher) as one oklog/run group, the way every subcommand of
// sluice shuts down: the first part to return, or the end of the command's
// context (SIGINT, SIGTERM), interrupts every other part; Wait returns the
// first part's error, wrapped with its name, or nil for a shutdown the
// context asked for. Closing what the parts hold (leaving consumer groups,
// flushing producers) is the caller's, after Wait.
type runGroup struct {
	g run.Group
}

// newRunGroup returns a group that stops, without error, when ctx ends.
func newRunGroup(ctx context.Context) *runGroup {
	r := new(runGroup)
	ctx, cancel := context.WithCancel(ctx)
	r.g.Add(func() error { <-ctx.Done(); return nil }, func(error) { cancel() })
	return r
}

// add runs fn with a context that the group cancels when it stops. fn must
// return soon after. Whatever fn returns before the group stops ends the
// process: its error, or errStopped for nil.
func (r *runGroup) add(name string, fn func(ctx context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	r.g.Add(func() error {
		err := fn(ctx)
		if ctx.Err() != nil {
			return nil // interrupted: the group is stopping for another reason
		}
		if err == nil {
			err = errStopped
		}
		return fmt.Errorf("%s: %w", name, err)
	}, func(error) { cancel() })
}

// addStop runs serve until stop is called: for servers whose own Serve does
// not take a context (net/http, gRPC). serve's return before the group stops
// ends the process like add's.
func (r *runGroup) addStop(name string, serve func() error, stop func()) {
	stopped := make(chan struct{})
	r.g.Add(func() error {
		err := serve()
		select {
		case <-stopped:
			return nil
		default:
		}
		if err == nil {
			err = errStopped
		}
		return fmt.Errorf("%s: %w", name, err)
	}, func(error) { close(stopped); stop() })
}

// wait runs the group until its first part returns and every part has
// stopped; it returns the first part's error.
func (r *runGroup) wait() error { return r.g.Run() }
