package catalog

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// seedBatch is how many rows the generator hands to COPY at a time; the
// generator runs on its own goroutine so rendering overlaps the COPY.
const seedBatch = 2000

// Seed loads count synthetic but realistic coin listings for ownerID with
// COPY: three languages (some translations or descriptions missing, to
// exercise the ENG fallback), 1–6 images of every type, characteristics,
// categories, prices (some unknown) and currencies, about 85% active. The
// same seed gives the same items. Item ids are "s<seed>-<n>" (valid by
// ValidItemID), so seeding the same owner twice needs another seed. updated_at is the wall clock when each
// row is generated (the whole load is one transaction; see the sync guide).
// It returns the number of rows written.
func Seed(ctx context.Context, pool *pgxpool.Pool, ownerID string, count int, seed int64) (int64, error) {
	owner, err := ParseOwnerID(ownerID)
	if err != nil {
		return 0, err
	}
	if count <= 0 {
		return 0, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	batches := make(chan [][]any, 4)
	go generate(ctx, owner, count, seed, batches)
	var n int64
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		n, err = tx.CopyFrom(ctx, pgx.Identifier{"export_items"}, seedColumns, &batchSource{ctx: ctx, ch: batches})
		return err
	})
	if err != nil {
		return 0, ownerError(fmt.Errorf("catalog: seed copy: %w", err))
	}
	return n, nil
}

var seedColumns = []string{"owner_id", "id", "coin_id", "listed_active", "price", "currency", "category",
	"characteristics", "images", "texts", "doc_eng", "doc_rus", "doc_ukr", "updated_at"}

// generate renders rows in batches until count rows are sent or ctx ends.
func generate(ctx context.Context, owner pgtype.UUID, count int, seed int64, out chan<- [][]any) {
	defer close(out)
	g := newSeeder(seed)
	for start := 0; start < count; start += seedBatch {
		batch := make([][]any, 0, min(seedBatch, count-start))
		for i := start; i < start+cap(batch); i++ {
			batch = append(batch, g.row(owner, i))
		}
		select {
		case out <- batch:
		case <-ctx.Done():
			return
		}
	}
}

// batchSource adapts the batch channel to pgx.CopyFromSource.
type batchSource struct {
	ctx   context.Context
	ch    <-chan [][]any
	batch [][]any
	i     int
}

func (s *batchSource) Next() bool {
	s.i++
	for s.i >= len(s.batch) {
		b, ok := <-s.ch
		if !ok {
			return false
		}
		s.batch, s.i = b, 0
	}
	return true
}

func (s *batchSource) Values() ([]any, error) { return s.batch[s.i], nil }

// Err fails the COPY when the generator stopped early because ctx ended, so
// a canceled seed never commits a partial load.
func (s *batchSource) Err() error { return s.ctx.Err() }

// seeder draws one item after another from a seeded source.
type seeder struct {
	rnd    *rand.Rand
	prefix string
}

func newSeeder(seed int64) *seeder {
	return &seeder{rnd: rand.New(rand.NewPCG(uint64(seed), 0x5eed)), prefix: "s" + strconv.FormatInt(seed, 10) + "-"}
}

func (g *seeder) row(owner pgtype.UUID, n int) []any {
	it, texts, images := g.item(n)
	return []any{owner, it.ID, it.CoinID, it.Status == StatusActive, numeric(it.Price), it.Currency,
		nullableJSON(it.Category), []byte(it.Characteristics), images, texts,
		string(Render(&it, "ENG")), string(Render(&it, "RUS")), string(Render(&it, "UKR")), time.Now()}
}
