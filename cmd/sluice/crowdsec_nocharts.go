//go:build nocharts

package main

import (
	"errors"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluice-rl/sluice/pipeline/stage"
)

// errNoCrowdSec is why sluice crowdsec and --crowdsec-alerts fail in a
// build with -tags nocharts (make sidecar's), which leaves out package
// crowdsec as it leaves out the charts: a sidecar needs neither. The
// command and flags stay, so that scripts still parse.
var errNoCrowdSec = errors.New("this sluice was built with -tags nocharts (the sidecar's build), without the CrowdSec client; use a full build")

func crowdsecCmd() *cobra.Command {
	return &cobra.Command{
		Use:                "crowdsec",
		Short:              "Be a CrowdSec bouncer (not in this build: use a full build)",
		DisableFlagParsing: true,
		RunE:               func(*cobra.Command, []string) error { return errNoCrowdSec },
	}
}

type crowdsecAlertFlags struct {
	url, machine, passwordFile string
	remediation                bool
}

func (a *crowdsecAlertFlags) add(f *pflag.FlagSet) {
	f.StringVar(&a.url, "crowdsec-alerts", "", "not in this build (-tags nocharts)")
	f.StringVar(&a.machine, "crowdsec-machine", "sluice", "not in this build (-tags nocharts)")
	f.StringVar(&a.passwordFile, "crowdsec-password-file", "", "not in this build (-tags nocharts)")
	f.BoolVar(&a.remediation, "crowdsec-remediation", false, "not in this build (-tags nocharts)")
}

// start fails with errNoCrowdSec when --crowdsec-alerts is given.
func (a *crowdsecAlertFlags) start(*stage.Writer, *slog.Logger, prometheus.Registerer) (func(), error) {
	if a.url != "" {
		return nil, errNoCrowdSec
	}
	return func() {}, nil
}
