#!/usr/bin/env python3
"""Writes sluice decision records to Kafka from Python: the proof that a
gateway in another language can feed sluice's pipeline (docs/decision-records.md).

    produce.py BOOTSTRAP TOPIC PB2_DIR EVENTS_JSON

PB2_DIR holds decision_pb2.py, generated from decision/decisionpb/decision.proto
with `protoc --python_out=PB2_DIR`. EVENTS_JSON is a list of
{"client_ip": ..., "event_time_ms": ..., "region": ...}. Each becomes one
Decision (schema version 1, outcome allowed), keyed as sluice's own producer
keys it (decision.RecordKey: "client_ip=<ip>" when there is no API key or
user), written with librdkafka (confluent-kafka). Prints the number of records
Kafka acknowledged; exits 1 if any was refused or not acknowledged in 30 s.
"""
import json
import sys


def main():
    bootstrap, topic, pb2_dir, events_path = sys.argv[1:5]
    sys.path.insert(0, pb2_dir)
    import decision_pb2  # generated at test time, never committed
    from confluent_kafka import Producer

    with open(events_path) as f:
        events = json.load(f)
    failed = []

    def delivered(err, msg):
        if err is not None:
            failed.append(str(err))

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    for e in events:
        d = decision_pb2.Decision(
            version=1,
            event_time_ms=e["event_time_ms"],
            region=e["region"],
            outcome=decision_pb2.OUTCOME_ALLOWED,
        )
        d.descriptors.client_ip = e["client_ip"]
        p.produce(topic, key=("client_ip=" + e["client_ip"]).encode(),
                  value=d.SerializeToString(), on_delivery=delivered)
        p.poll(0)
    left = p.flush(30)
    if left or failed:
        print("produce.py: %d not acknowledged, %d refused: %s" % (left, len(failed), failed[:3]), file=sys.stderr)
        return 1
    print(len(events))
    return 0


if __name__ == "__main__":
    sys.exit(main())
