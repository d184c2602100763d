//go:build !sidecar

package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/sluice-rl/sluice/pipeline"
)

// kafkaCmd runs franz-go's kfake, an in-process Kafka broker that speaks the
// real protocol, as a process of its own: the broker of a local stack
// (deploy/local/up), where real Kafka is not at hand.
func kafkaCmd() *cobra.Command {
	var (
		port       int
		partitions int32
		dataDir    string
	)
	cmd := &cobra.Command{
		Use:   "kafka",
		Short: "Run a Kafka broker for a local stack (franz-go's kfake, on loopback): not for production",
		Long: `Kafka runs franz-go's kfake, an in-memory Kafka broker that speaks the real
protocol, on 127.0.0.1:--port, with the decision topic created with
--partitions partitions. It is the broker of deploy/local/up and of trying
sluice out; production points sluice at real Kafka. With --data-dir its
topics survive a restart. SIGTERM or SIGINT stops it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if port < 0 || port > 65535 {
				return fmt.Errorf("--port %d: want 0 to 65535", port)
			}
			if partitions < 1 || partitions > 4096 {
				return fmt.Errorf("--partitions %d: want 1 to 4096", partitions)
			}
			opts := []kfake.Opt{kfake.NumBrokers(1), kfake.Ports(port), kfake.SeedTopics(partitions, pipeline.DefaultTopic)}
			if dataDir != "" {
				opts = append(opts, kfake.DataDir(dataDir))
			}
			kc, err := kfake.NewCluster(opts...)
			if err != nil {
				var op *net.OpError
				if errors.As(err, &op) {
					return fmt.Errorf("--port %d: %w", port, err)
				}
				return err
			}
			defer kc.Close()
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			log.Info("kafka (kfake) serving", "addr", kc.ListenAddrs()[0], "topic", pipeline.DefaultTopic, "partitions", partitions, "data_dir", dataDir)
			<-cmd.Context().Done()
			log.Info("kafka (kfake) stopped")
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&port, "port", 9092, "port on 127.0.0.1 (0: any free port)")
	f.Int32Var(&partitions, "partitions", 4, "partitions of the decision topic")
	f.StringVar(&dataDir, "data-dir", "", "directory that keeps the topics across restarts (default: memory only)")
	return cmd
}
