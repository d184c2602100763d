// Package pipeline is sluice's slow loop: the decision-record codec
// (decisionpb), the Kafka producer enforcers log decisions with, and the
// consumer group that runs stages (the detector, the aggregator) over the
// decisions topic on event time and writes their output to every region's
// Redis.
//
// # Usage
//
//	prod, err := pipeline.NewProducer(pipeline.ProducerOptions{Brokers: brokers})
//	lim, err := enforcer.New(rdb, set, enforcer.Options{Sink: prod})
//
//	cons, err := pipeline.NewConsumer(pipeline.ConsumerOptions{
//		Brokers: brokers,
//		Stages:  []pipeline.Stage{detector.NewHeavyHitters(detector.HeavyHitterOptions{}), shares},
//		Writer:  pipeline.NewRegionWriter(stores),
//	})
//	go cons.Run(ctx)
//
// Metrics:
//
//	sluice_pipeline_producer_records_total{result}  logged, dropped, produced, failed
//	sluice_pipeline_records_total{result}           consumed, bad, late
package pipeline
