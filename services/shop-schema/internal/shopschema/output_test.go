package shopschema

import (
	"encoding/json"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/coinexport/export/services/shop-schema/internal/prestashop"
)

func lang(id int, iso, locale string, active bool) prestashop.Language {
	return prestashop.Language{ID: prestashop.Int(id), ISOCode: prestashop.String(iso),
		Locale: prestashop.String(locale), Active: prestashop.Bool(active)}
}

func TestLanguageMatching(t *testing.T) {
	tests := []struct {
		name  string
		langs []prestashop.Language
		want  map[int64]string
	}{
		{"en ru uk", []prestashop.Language{lang(1, "en", "en-US", true), lang(2, "ru", "ru-RU", true), lang(3, "uk", "uk-UA", true)},
			map[int64]string{1: "ENG", 2: "RUS", 3: "UKR"}},
		{"gb is English", []prestashop.Language{lang(4, "gb", "en-GB", true)}, map[int64]string{4: "ENG"}},
		{"en preferred over gb", []prestashop.Language{lang(1, "gb", "en-GB", true), lang(2, "en", "en-US", true)},
			map[int64]string{2: "ENG"}},
		{"active preferred over inactive", []prestashop.Language{lang(1, "ru", "ru-RU", false), lang(5, "ru", "ru-RU", true)},
			map[int64]string{5: "RUS"}},
		{"ua accepted, locale fallback", []prestashop.Language{lang(1, "ua", "", true), lang(2, "xx", "en-AU", true)},
			map[int64]string{1: "UKR", 2: "ENG"}},
		{"other languages ignored", []prestashop.Language{lang(1, "fr", "fr-FR", true), lang(2, "de", "de-DE", true)},
			map[int64]string{}},
	}
	for _, tt := range tests {
		_, tx := languages(tt.langs)
		if diff := cmp.Diff(tt.want, tx.content); diff != "" {
			t.Errorf("languages(%s) (-want +got):\n%s", tt.name, diff)
		}
	}
}

func TestResolve(t *testing.T) {
	tx := texts{content: map[int64]string{1: "RUS", 2: "ENG"}}
	lv := func(id int, v string) prestashop.LangValue {
		return prestashop.LangValue{LanguageID: prestashop.Int(id), Value: prestashop.String(v)}
	}
	byLang := func(vs ...prestashop.LangValue) prestashop.Text { return prestashop.Text{ByLang: vs} }
	tests := []struct {
		name      string
		tx        texts
		in        prestashop.Text
		wantName  string
		wantNames Names
	}{
		{"English is the default name", tx, byLang(lv(1, "Металл"), lv(2, "Metal")),
			"Metal", Names{"RUS": "Металл", "ENG": "Metal"}},
		{"first language without English", tx, byLang(lv(3, "Métal"), lv(1, "Металл")),
			"Métal", Names{"RUS": "Металл"}},
		{"empty translations skipped", tx, byLang(lv(2, ""), lv(1, "Металл")),
			"Металл", Names{"RUS": "Металл"}},
		{"plain string in a one-language shop", texts{plain: "UKR"}, prestashop.Text{Plain: "Метал", IsPlain: true},
			"Метал", Names{"UKR": "Метал"}},
		{"plain string, language unknown", texts{}, prestashop.Text{Plain: "Metal", IsPlain: true}, "Metal", nil},
	}
	for _, tt := range tests {
		name, names := tt.tx.resolve(tt.in)
		if name != tt.wantName {
			t.Errorf("resolve(%s) name = %q, want %q", tt.name, name, tt.wantName)
		}
		if diff := cmp.Diff(tt.wantNames, names); diff != "" {
			t.Errorf("resolve(%s) names (-want +got):\n%s", tt.name, diff)
		}
	}
}

// FuzzBuild builds the answer from a shop's features and values of every
// count and order, ids repeated, custom values mixed in: each feature
// lists its own shared values, sorted, at most 5000 of them (spec 2.6, 8),
// the lowest ids when it has more, and says it was cut then.
func FuzzBuild(f *testing.F) {
	f.Add(uint64(1), uint8(3), uint16(6000), uint8(10), uint32(7000))
	f.Add(uint64(2), uint8(1), uint16(5000), uint8(0), uint32(5000))
	f.Add(uint64(3), uint8(1), uint16(5001), uint8(0), uint32(100000))
	f.Add(uint64(4), uint8(2), uint16(10002), uint8(50), uint32(3))
	f.Add(uint64(5), uint8(0), uint16(10), uint8(0), uint32(10))
	f.Add(uint64(6), uint8(8), uint16(0), uint8(0), uint32(1))
	f.Add(uint64(7), uint8(1), uint16(16000), uint8(0), uint32(1<<20)) // about 5333 for each of 3 ids
	f.Add(uint64(8), uint8(1), uint16(16383), uint8(5), uint32(4))     // the same few value ids again and again
	f.Fuzz(func(t *testing.T, seed uint64, features uint8, values uint16, customPercent uint8, idRange uint32) {
		r := rand.New(rand.NewPCG(seed, seed>>32))
		s := &prestashop.Schema{}
		ids := int(features%9) + 2 // feature ids 0..ids-1: few, so that some have over 5000 values
		for range features % 9 {
			s.Features = append(s.Features, prestashop.Feature{ID: prestashop.Int(r.IntN(ids))})
		}
		want := map[int64][]int64{} // feature id → ids of its shared values
		for range values % 16384 {
			v := prestashop.FeatureValue{ID: prestashop.Int(r.Int64N(int64(idRange) + 1)),
				FeatureID: prestashop.Int(r.IntN(ids)), Custom: prestashop.Bool(r.IntN(100) < int(customPercent))}
			s.Values = append(s.Values, v)
			if !v.Custom {
				want[int64(v.FeatureID)] = append(want[int64(v.FeatureID)], int64(v.ID))
			}
		}
		got := build(s)
		if len(got.Features) != len(s.Features) {
			t.Fatalf("build: %d features, want %d", len(got.Features), len(s.Features))
		}
		for i, feat := range got.Features {
			if i > 0 && got.Features[i-1].ID > feat.ID {
				t.Fatalf("build: feature %d after feature %d, want them sorted by id", feat.ID, got.Features[i-1].ID)
			}
			wantIDs := slices.Sorted(slices.Values(want[feat.ID]))
			truncated := len(wantIDs) > maxValuesPerFeature
			wantIDs = wantIDs[:min(len(wantIDs), maxValuesPerFeature)]
			gotIDs := make([]int64, len(feat.Values))
			for j, v := range feat.Values {
				gotIDs[j] = v.ID
			}
			if feat.ValuesTruncated != truncated || !slices.Equal(gotIDs, wantIDs) {
				t.Fatalf("build: feature %d has %d values (truncated %v), want %d (truncated %v): the %d lowest of its shared values",
					feat.ID, len(feat.Values), feat.ValuesTruncated, len(wantIDs), truncated, maxValuesPerFeature)
			}
		}
		if _, err := json.Marshal(got); err != nil {
			t.Fatalf("json.Marshal(build()) = %v", err)
		}
	})
}
