// Package decisionpb holds the generated protobuf code for the decision record.
// The schema is decision.proto beside this file; the codec and its rules are
// in package decision.
package decisionpb

//go:generate protoc --go_out=. --go_opt=paths=source_relative decision.proto
