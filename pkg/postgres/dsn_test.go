package postgres

import "testing"

func TestWithPoolSizeAndRedact(t *testing.T) {
	tests := []struct{ dsn, wantPool, wantRedacted string }{
		{"postgres://u:pw@db:5432/x?sslmode=disable", "postgres://u:pw@db:5432/x?pool_max_conns=8&sslmode=disable", "postgres://u:xxxxx@db:5432/x?sslmode=disable"},
		{"host=/run/pg user=u password=pw dbname=x", "host=/run/pg user=u password=pw dbname=x pool_max_conns=8", "host=/run/pg user=u password=xxxxx dbname=x"},
	}
	for _, tt := range tests {
		if got := WithPoolSize(tt.dsn, 8); got != tt.wantPool {
			t.Errorf("WithPoolSize(%q, 8) = %q, want %q", tt.dsn, got, tt.wantPool)
		}
		if got := Redact(tt.dsn); got != tt.wantRedacted {
			t.Errorf("Redact(%q) = %q, want %q", tt.dsn, got, tt.wantRedacted)
		}
	}
}
